"""The released models' full-size configurations as dlmrt's own configs (no checkpoint needed):
what the benchmarks fill with random weights and the GPU tests run at the real widths. One place
for these numbers; a benchmark or test derives its shapes (MoE layer, attention, GEMM) from them.

- QwenDLM-4B + ORL adapter: Qwen3-4B dims (hidden 2560, 32 / 8 heads of 128, MLP 9728, vocab
  151936), 256-token blocks.
- LLaDA-2.1-mini: 20 layers (layer 0 dense, intermediate 5120), hidden 2048, 16 / 4 heads of 128,
  partial rotary 64, 256 experts x 512 in 8 groups (top-4 groups), top-8, one shared expert, vocab
  157184, 32-row blocks.
- DiffusionGemma-26B-A4B's text tower: 5 x [5 sliding, 1 full] layers, 16 query heads; sliding:
  head 256, 8 KV heads, window 1024; full: head 512, 2 KV heads (K = V); dense GeGLU 2112, 128
  experts x 704, top-8; vocab 262144, softcap 30, 256-row canvas.

`layers` keeps a model's widths with fewer layers (a benchmark that fits a device call).
"""

from __future__ import annotations

from dlmrt.models.config import ModelConfig
from dlmrt.models.diffusion_gemma_config import FULL, SLIDING, DiffusionGemmaConfig, RopeSpec
from dlmrt.models.llada2_config import LLaDA2Config
from dlmrt.models.residual import ResidualConfig


def qwen_dlm_4b(layers: int = 36) -> ModelConfig:
    """QwenDLM-4B + ORL adapter (Qwen3-4B dims, 256-token blocks)."""
    return ModelConfig(
        architecture="SDARForCausalLM",
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=5e6,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        mask_token_id=151669,
        block_size=256,
        residual=ResidualConfig(
            intermediate_size=9728, input_scale=0.125, output_scale=0.125, post_norm_scale=0.02
        ),
    )


def llada21_mini(layers: int = 20) -> LLaDA2Config:
    """LLaDA-2.1-mini (layer 0 dense, the rest MoE; 32-row blocks)."""
    return LLaDA2Config(
        architecture="LLaDA2MoeModelLM",
        vocab_size=157184,
        hidden_size=2048,
        intermediate_size=5120,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        rotary_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=600000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        mask_token_id=156895,
        block_size=32,
        num_experts=256,
        top_k=8,
        n_group=8,
        topk_group=4,
        moe_intermediate_size=512,
        num_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        expert_bias=True,
    )


def diffusion_gemma_26b(layers: int = 30) -> DiffusionGemmaConfig:
    """DiffusionGemma-26B-A4B's text tower (every sixth layer full, the rest sliding)."""
    types = tuple(FULL if i % 6 == 5 else SLIDING for i in range(layers))
    return DiffusionGemmaConfig(
        architecture="DiffusionGemmaForBlockDiffusion",
        vocab_size=262144,
        hidden_size=2816,
        intermediate_size=2112,
        self_conditioning_size=2112,
        num_attention_heads=16,
        layer_types=types,
        head_dims=tuple(512 if t == FULL else 256 for t in types),
        kv_heads=tuple(2 if t == FULL else 8 for t in types),
        rope={SLIDING: RopeSpec(theta=1e4), FULL: RopeSpec(theta=1e6, rotary_factor=0.25)},
        sliding_window=1024,
        rms_norm_eps=1e-6,
        num_experts=128,
        top_k_experts=8,
        moe_intermediate_size=704,
        final_logit_softcapping=30.0,
        max_position_embeddings=262144,
        canvas_length=256,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_ids=(1, 106, 50),
    )


def layer_widths(cfg: DiffusionGemmaConfig, kind: str) -> tuple[int, int]:
    """(head dim, KV heads) of DiffusionGemma's `kind` layers (SLIDING or FULL)."""
    i = cfg.layer_types.index(kind)
    return cfg.head_dims[i], cfg.kv_heads[i]
