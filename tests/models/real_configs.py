"""The released checkpoints' config files, key for key, at tiny widths.

Each function returns a fresh dict with exactly the keys the public file has (same names, same
omissions, same nesting); only sizes are shrunk. Token ids keep their real values, so each
vocabulary stays large enough to hold them. Sources (public copies of the files):

- DiffusionGemma: `google/diffusiongemma-26B-A4B-it` config.json and generation_config.json as
  shipped (transformers 5.8), and the same model re-saved by transformers >= 5.15, which drops
  `global_head_dim` / `num_global_key_value_heads` for `per_layer_config` (what 5.24 writes).
- LLaDA-2.1-mini: `inclusionAI/LLaDA2.1-mini` config.json (no `eos_token_id`, `mask_token_id` or
  `use_qk_norm`).
- SDAR-4B: `JetLM/SDAR-4B-Chat` config.json (no `block_size` or `mask_token_id`), and a fine-tune
  of it that adds `block_causal_prompt`, `block_size` and `mask_token_id` (151669, `<|MASK|>`).
"""

from __future__ import annotations

import copy
from typing import Any

S, F = "sliding_attention", "full_attention"
DG_LAYERS = [S, S, S, S, S, F]  # the released pattern ([S x 5, F] x 5), one period
DG_EOS = [1, 106, 50]  # <eos>, <turn|>, <|tool_response>
DG_VOCAB = 128  # holds the stop ids; the image ids (255999, 258880, 258882) are never looked up


def dg_config() -> dict[str, Any]:
    """DiffusionGemma's config.json as shipped (full layers: `global_head_dim`,
    `num_global_key_value_heads`; a `vision_config` dlmrt ignores)."""
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 2,
        "dtype": "bfloat16", "eos_token_id": 1, "final_logit_softcapping": 30.0,
        "global_head_dim": 16, "head_dim": 8, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 48,
        "layer_types": list(DG_LAYERS), "max_position_embeddings": 256,
        "model_type": "diffusion_gemma_text", "moe_intermediate_size": 12,
        "num_attention_heads": 4, "num_experts": 4, "num_global_key_value_heads": 1,
        "num_hidden_layers": len(DG_LAYERS), "num_key_value_heads": 2, "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            F: {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            S: {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 5, "tie_word_embeddings": True, "top_k_experts": 2,
        "use_bidirectional_attention": "vision", "vocab_size": DG_VOCAB,
    }  # fmt: skip
    vision = {
        "head_dim": 8, "hidden_size": 16, "intermediate_size": 32, "model_type": "gemma4_vision",
        "num_attention_heads": 2, "num_hidden_layers": 1, "patch_size": 16,
        "pooling_kernel_size": 3, "position_embedding_size": 10240, "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"}, "standardize": True,
        "use_clipped_linears": False, "default_output_length": 280,
    }  # fmt: skip
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"], "boi_token_id": 255999,
        "canvas_length": 8, "dtype": "bfloat16", "eoi_token_id": 258882,
        "eos_token_id": list(DG_EOS), "image_token_id": 258880, "initializer_range": 0.02,
        "model_type": "diffusion_gemma", "text_config": text, "tie_word_embeddings": True,
        "transformers_version": "5.8.0.dev0", "vision_config": vision,
        "vision_soft_tokens_per_image": 280,
    }  # fmt: skip


def dg_config_resaved() -> dict[str, Any]:
    """The same model as transformers >= 5.15 saves it: the full layers' head dim and KV heads in
    `per_layer_config` (keyed by layer index), the two global fields gone."""
    cfg = copy.deepcopy(dg_config())
    text = cfg["text_config"]
    full = {"head_dim": text.pop("global_head_dim")}
    full["num_key_value_heads"] = text.pop("num_global_key_value_heads")
    text["per_layer_config"] = {str(i): dict(full) for i, k in enumerate(DG_LAYERS) if k == F}
    cfg["transformers_version"] = "5.24.0"
    return cfg


def dg_generation_config() -> dict[str, Any]:
    """DiffusionGemma's generation_config.json as shipped."""
    return {
        "confidence_threshold": 0.005, "eos_token_id": list(DG_EOS), "max_denoising_steps": 48,
        "max_new_tokens": 256, "pad_token_id": 0,
        "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
        "stability_threshold": 1, "t_max": 0.8, "t_min": 0.4, "transformers_version": "5.8.0.dev0",
    }  # fmt: skip


def dg_generation_config_resaved() -> dict[str, Any]:
    """A generation_config.json transformers >= 5.16 writes for a model saved without one."""
    return {
        "confidence_threshold": None, "max_denoising_steps": None,
        "return_dict_in_generate": True, "sampler_config": None, "stability_threshold": None,
        "t_max": None, "t_min": None, "transformers_version": "5.16.0.dev0",
    }  # fmt: skip


LLADA_PAD, LLADA_MASK, LLADA_VOCAB = 156892, 156895, 157184


def llada21_mini_config() -> dict[str, Any]:
    """LLaDA-2.1-mini's config.json as shipped: no `eos_token_id`, `mask_token_id`, `use_qk_norm`;
    `rotary_dim`, `router_dtype` and `use_rmsnorm` present."""
    return {
        "architectures": ["LLaDA2MoeModelLM"], "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        "dtype": "bfloat16", "embedding_dropout": 0.0, "first_k_dense_replace": 1,
        "head_dim": 8, "hidden_act": "silu", "hidden_size": 16, "initializer_range": 0.02,
        "intermediate_size": 32, "max_position_embeddings": 512, "max_window_layers": 28,
        "model_type": "llada2_moe", "moe_intermediate_size": 8,
        "moe_router_enable_expert_bias": True, "n_group": 2, "norm_head": False,
        "norm_softmax": False, "norm_topk_prob": True, "num_attention_heads": 2,
        "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
        "num_key_value_heads": 1, "num_shared_experts": 1, "output_dropout": 0.0,
        "output_router_logits": False, "pad_token_id": LLADA_PAD, "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 600000, "rotary_dim": 4,
        "routed_scaling_factor": 2.5, "router_dtype": "fp32", "score_function": "sigmoid",
        "sliding_window": 4096, "tie_word_embeddings": False, "topk_group": 1,
        "transformers_version": "4.57.1", "use_bias": False, "use_cache": False,
        "use_qkv_bias": False, "use_rmsnorm": True, "use_sliding_window": False,
        "vocab_size": LLADA_VOCAB,
    }  # fmt: skip


SDAR_EOS, SDAR_MASK, SDAR_VOCAB = 151643, 151669, 151936


def sdar_4b_config() -> dict[str, Any]:
    """SDAR-4B-Chat's config.json as shipped (Qwen3 keys plus SDAR's training switches)."""
    return {
        "architectures": ["SDARForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
        "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "flex_attention",
        "bos_token_id": SDAR_EOS, "debug": False, "eos_token_id": SDAR_EOS, "ep_size": 1,
        "fuse_cross_entropy": True, "head_dim": 8, "hidden_act": "silu", "hidden_size": 16,
        "initializer_range": 0.02, "intermediate_size": 32, "max_position_embeddings": 512,
        "max_window_layers": 2, "micro_forward": False, "model_type": "sdar",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "skip_checkpoint": False, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.52.4", "use_cache": False,
        "use_deepep": False, "use_sliding_window": False, "vocab_size": SDAR_VOCAB,
    }  # fmt: skip


def sdar_4b_finetune_config() -> dict[str, Any]:
    """A fine-tune of SDAR-4B-Chat as saved by its trainer: `block_causal_prompt`, `block_size`
    and `mask_token_id` added, `attn_implementation` gone."""
    cfg = sdar_4b_config()
    del cfg["attn_implementation"]
    cfg.update(block_causal_prompt=True, block_size=4, mask_token_id=SDAR_MASK)
    cfg["auto_map"]["AutoModel"] = "modeling_sdar.SDARForCausalLM"
    return dict(sorted(cfg.items()))
