"""Shared fixtures: tiny random checkpoints written by transformers' own `save_pretrained`."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# The repository root holds `kernels/` (installed as `dlmrt._kernels`). On sys.path (`python -m
# pytest` puts the working directory there, and so do xdist's workers) it would shadow PyPI's
# `kernels` package, which transformers >= 5.25 imports when installed: keep the root off it.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from dlmrt.train.tokenizer import CHAT_TEMPLATE, SPECIALS  # noqa: E402

# Tiny models: torch's intra-op threads only contend with the other xdist workers (one a core).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def slow_unless(keep: bool, *values: Any) -> Any:
    """A parametrize case, marked `slow` unless `keep`: the default run keeps a representative
    subset of a costly grid, `pytest -m slow` (CI, after the default run) the rest."""
    return pytest.param(*values, marks=() if keep else pytest.mark.slow)


VOCAB = 260  # byte-level tokenizer: 256 bytes + <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258, <|MASK|> 259
MASK_ID = 259
EOS_ID = 256


def _byte_tokenizer():
    """Byte-level tokenizer of 256 bytes plus the four specials (ids 256..259); no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def tiny_qwen3_config(**overrides: Any):
    from transformers import Qwen3Config

    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        initializer_range=0.3,  # peaked logits, so rules accept several rows per round
        tie_word_embeddings=False,
        eos_token_id=EOS_ID,
    )
    kwargs.update(overrides)
    return Qwen3Config(**kwargs)


def write_checkpoint(
    out: Path,
    *,
    seed: int = 0,
    residual: dict[str, Any] | None = None,
    architecture: str = "SDARForCausalLM",
    block_size: int | None = 8,
    tokenizer: bool = True,
    **config_overrides: Any,
) -> Path:
    """Save a random Qwen3ForCausalLM with transformers, then add dlmrt's fields (and ORL adapter)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_qwen3_config(**config_overrides)).eval()
    model.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["architectures"] = [architecture]
    cfg["mask_token_id"] = MASK_ID
    if block_size is not None:
        cfg["block_size"] = block_size
    if residual is not None:
        cfg["orl_residual"] = residual
        weights = load_file(str(out / "model.safetensors"))
        gen = torch.Generator().manual_seed(seed + 1)
        hidden, inter = cfg["hidden_size"], residual["intermediate_size"]
        prefix = "model.residual_adapter."
        weights[prefix + "norm.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
        weights[prefix + "gate_proj.weight"] = 0.2 * torch.randn(inter, hidden, generator=gen)
        weights[prefix + "up_proj.weight"] = 0.2 * torch.randn(inter, hidden, generator=gen)
        weights[prefix + "down_proj.weight"] = 0.2 * torch.randn(hidden, inter, generator=gen)
        save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if tokenizer:
        _byte_tokenizer().save(str(out / "tokenizer.json"))
        (out / "tokenizer_config.json").write_text(
            json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>"})
        )
    return out


def residual_config(
    positions: str = "masked", post_norm_scale: float | None = 0.02, **kw: Any
) -> dict:
    cfg = {
        "intermediate_size": 48,
        "input_scale": 1.0,
        "output_scale": 1.0,
        "strength": 1.0,
        "post_norm_scale": post_norm_scale,
        "positions": positions,
        "temperature": 1.0,
    }
    cfg.update(kw)
    return cfg


@pytest.fixture
def base_ckpt(tmp_path: Path) -> Path:
    """A Base QwenDLM (SDAR) checkpoint: no adapter, untied head, block size 8."""
    return write_checkpoint(tmp_path / "base")


@pytest.fixture
def orl_ckpt(tmp_path: Path) -> Path:
    """An ORL QwenDLM checkpoint: adapter on masked rows, post-norm 0.02, block size 8."""
    return write_checkpoint(tmp_path / "orl", residual=residual_config())


LLADA_CHAT_TEMPLATE = (
    "{% for m in messages %}<role>{{ {'user': 'HUMAN', 'assistant': 'ASSISTANT', 'system': "
    "'SYSTEM'}[m['role']] }}</role>{{ m['content'] }}<|role_end|>{% endfor %}"
    "{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
)


def llada2_config(**overrides: Any) -> dict[str, Any]:
    """A tiny `llada2_moe` config.json: layer 0 dense, then MoE with 8 experts in 4 groups."""
    cfg = {
        "architectures": ["LLaDA2MoeModelLM"],
        "model_type": "llada2_moe",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "partial_rotary_factor": 0.5,
        "rotary_dim": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 600000.0,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "use_qkv_bias": False,
        "use_bias": False,
        "use_qk_norm": True,
        "hidden_act": "silu",
        "num_experts": 8,
        "num_shared_experts": 1,
        "num_experts_per_tok": 3,
        "n_group": 4,
        "topk_group": 2,
        "moe_intermediate_size": 24,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "norm_topk_prob": True,
        "eos_token_id": EOS_ID,
        "pad_token_id": EOS_ID,
        "mask_token_id": MASK_ID,
        "block_size": 8,
    }
    cfg.update(overrides)
    return cfg


def llada2_weights(cfg: dict[str, Any], seed: int, std: float = 0.3) -> dict[str, torch.Tensor]:
    """Random weights under the HF names (per-expert tensors, fused query_key_value)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = std) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=gen)

    h, heads, kv, d = (
        cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    )
    w = {"model.word_embeddings.weight": rnd(cfg["vocab_size"], h, scale=1.0)}
    w["model.norm.weight"] = 1.0 + 0.1 * rnd(h, scale=1.0)
    w["lm_head.weight"] = rnd(cfg["vocab_size"], h)
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        w[p + "input_layernorm.weight"] = 1.0 + 0.1 * rnd(h, scale=1.0)
        w[p + "post_attention_layernorm.weight"] = 1.0 + 0.1 * rnd(h, scale=1.0)
        w[p + "attention.query_key_value.weight"] = rnd((heads + 2 * kv) * d, h)
        w[p + "attention.query_layernorm.weight"] = 1.0 + 0.1 * rnd(d, scale=1.0)
        w[p + "attention.key_layernorm.weight"] = 1.0 + 0.1 * rnd(d, scale=1.0)
        w[p + "attention.dense.weight"] = rnd(h, heads * d)
        mlps = []
        if n < cfg["first_k_dense_replace"]:
            mlps.append((p + "mlp.", cfg["intermediate_size"]))
        else:
            e, inter = cfg["num_experts"], cfg["moe_intermediate_size"]
            w[p + "mlp.gate.weight"] = rnd(e, h)
            w[p + "mlp.gate.expert_bias"] = 0.1 * rnd(e, scale=1.0)
            mlps += [(f"{p}mlp.experts.{i}.", inter) for i in range(e)]
            if cfg["num_shared_experts"]:
                mlps.append((p + "mlp.shared_experts.", inter * cfg["num_shared_experts"]))
        for prefix, inter in mlps:
            w[prefix + "gate_proj.weight"] = rnd(inter, h)
            w[prefix + "up_proj.weight"] = rnd(inter, h)
            w[prefix + "down_proj.weight"] = rnd(h, inter)
    return w


def write_llada2_checkpoint(
    out: Path,
    *,
    seed: int = 0,
    residual: dict[str, Any] | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    **config_overrides: Any,
) -> Path:
    """A tiny random LLaDA2 checkpoint in the HF layout (+ the ORL adapter when `residual`)."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = llada2_config(**config_overrides)
    w = llada2_weights(cfg, seed) if weights is None else weights
    if residual is not None:
        cfg["orl_residual"] = residual
        gen = torch.Generator().manual_seed(seed + 1)
        hidden, inter = cfg["hidden_size"], residual["intermediate_size"]
        prefix = "model.residual_adapter."
        w[prefix + "norm.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
        w[prefix + "gate_proj.weight"] = 0.3 * torch.randn(inter, hidden, generator=gen)
        w[prefix + "up_proj.weight"] = 0.3 * torch.randn(inter, hidden, generator=gen)
        w[prefix + "down_proj.weight"] = 0.3 * torch.randn(hidden, inter, generator=gen)
    save_file({k: v.contiguous() for k, v in w.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    _byte_tokenizer().save(str(out / "tokenizer.json"))
    (out / "chat_template.jinja").write_text(LLADA_CHAT_TEMPLATE)
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return out


def assert_modes_agree(outs: dict, *where: object) -> None:
    """outs: mode -> GenerationOutput of the same request. Each ran in its mode and equals eager's
    tokens, rounds per block and finish reason (`where` labels a failure)."""
    ref = outs["eager"]
    for mode, out in outs.items():
        assert out.mode == mode
        assert out.token_ids == ref.token_ids, (mode, *where)
        assert out.rounds_per_block == ref.rounds_per_block, (mode, *where)
        assert out.finish_reason == ref.finish_reason, (mode, *where)


@contextmanager
def serve_in_thread(app, **config) -> Iterator[str]:
    """uvicorn serving `app` in a background thread on a free loopback port; yields its URL.
    `config`: more `uvicorn.Config` arguments."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
