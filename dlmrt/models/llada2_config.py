"""LLaDA2Config: the `llada2_moe` fields of `config.json` (LLaDA2.0 / 2.1 `LLaDA2MoeModelLM`).

Every value comes from the checkpoint. A missing required field, an unsupported option (biases,
sliding window, non-sigmoid router, RoPE scaling) or an inconsistent MoE grouping raises
`CheckpointError` naming the field and the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmrt.errors import CheckpointError
from dlmrt.models.config import (
    ModelConfig,
    _field,
    _optional_id,
    _size,
    check_heads,
    eos_ids,
    positive_float,
)
from dlmrt.models.residual import ResidualConfig

# LLaDA2 trains and decodes with 32-token blocks (official `generate` default `block_length=32`);
# HF configs carry no block field. A `block_size` in config.json overrides it.
DEFAULT_BLOCK_LENGTH = 32
# The released config.json has neither `mask_token_id` nor `eos_token_id`: the official `generate`
# defaults to mask 156895 (the tokenizer's <|mask|>) and stops on 156892 (<|endoftext|>, the
# config's `pad_token_id`).
DEFAULT_MASK_ID = 156895


@dataclass(frozen=True, slots=True, kw_only=True)
class LLaDA2Config(ModelConfig):
    """ModelConfig's fields (`intermediate_size`: the dense SwiGLU layers 0 .. first_k_dense_replace
    - 1) plus partial rotary and the MoE."""

    rotary_dim: int  # leading dims of each head that RoPE rotates (partial rotary)
    num_experts: int
    top_k: int  # num_experts_per_tok
    n_group: int
    topk_group: int
    moe_intermediate_size: int
    num_shared_experts: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    expert_bias: bool  # moe_router_enable_expert_bias


def _refuse(cfg: dict[str, Any], path: Path, name: str, bad: Any, why: str) -> None:
    if name in cfg and cfg[name] == bad:
        raise CheckpointError(f"{path}: config field '{name}' = {cfg[name]!r}: {why}")


def _check_supported(cfg: dict[str, Any], path: Path) -> None:
    _refuse(cfg, path, "use_qkv_bias", True, "attention biases are not supported")
    _refuse(cfg, path, "use_bias", True, "linear biases are not supported")
    _refuse(cfg, path, "use_qk_norm", False, "only QK-norm models are supported")
    _refuse(cfg, path, "use_sliding_window", True, "sliding-window attention is not supported")
    _refuse(cfg, path, "use_rmsnorm", False, "only RMSNorm models are supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: config field 'hidden_act' must be 'silu'")
    if cfg.get("score_function", "sigmoid") != "sigmoid":
        raise CheckpointError(f"{path}: config field 'score_function' must be 'sigmoid'")
    rope = cfg.get("rope_scaling") or {}
    if (rope.get("rope_type") or rope.get("type") or "default") != "default":
        raise CheckpointError(f"{path}: config field 'rope_scaling' = {rope!r} is not supported")


def _rotary_dim(cfg: dict[str, Any], head_dim: int, path: Path) -> int:
    """`rotary_dim` if given, else int(head_dim * partial_rotary_factor); they must agree."""
    factor = cfg.get("partial_rotary_factor")
    if factor is None and cfg.get("rotary_dim") is None:
        raise CheckpointError(f"{path}: missing required config field 'partial_rotary_factor'")
    dim = int(head_dim * float(factor)) if factor is not None else None
    if cfg.get("rotary_dim") is not None:
        given = _field(cfg, "rotary_dim", path)
        if dim is not None and given != dim:
            raise CheckpointError(
                f"{path}: 'rotary_dim' = {given} disagrees with 'partial_rotary_factor' = {factor}"
            )
        dim = given
    if dim < 2 or dim % 2 or dim > head_dim:
        raise CheckpointError(f"{path}: rotary dim {dim} must be even and in [2, {head_dim}]")
    return dim


def _mask_id(cfg: dict[str, Any], vocab: int, path: Path) -> int | None:
    """`mask_token_id`, else DEFAULT_MASK_ID when the vocabulary holds it (else None: the
    tokenizer's mask token decides)."""
    if cfg.get("mask_token_id") is None:
        return DEFAULT_MASK_ID if DEFAULT_MASK_ID < vocab else None
    return _optional_id(cfg, "mask_token_id", vocab, path)


def _stop_ids(cfg: dict[str, Any], vocab: int, path: Path) -> tuple[int, ...]:
    """`eos_token_id`, else `pad_token_id` (the official `generate` stops on the pad id)."""
    if cfg.get("eos_token_id") is not None:
        return eos_ids(cfg["eos_token_id"], path, vocab)
    pad = _optional_id(cfg, "pad_token_id", vocab, path)
    return () if pad is None else (pad,)


def _check_moe(c: LLaDA2Config, path: Path) -> None:
    per_group = c.num_experts // c.n_group if c.n_group > 0 else 0
    if c.n_group < 1 or c.num_experts % c.n_group or per_group < 2:
        raise CheckpointError(
            f"{path}: 'n_group' = {c.n_group} must divide 'num_experts' = {c.num_experts} "
            "into groups of at least 2 experts (a group's score is its top-2 sum)"
        )
    if not 1 <= c.topk_group <= c.n_group:
        raise CheckpointError(f"{path}: 'topk_group' = {c.topk_group} must be in [1, {c.n_group}]")
    if not 1 <= c.top_k <= c.topk_group * per_group:
        raise CheckpointError(
            f"{path}: 'num_experts_per_tok' = {c.top_k} must be in [1, topk_group * "
            f"experts per group = {c.topk_group * per_group}]"
        )
    if not 0 <= c.first_k_dense_replace <= c.num_hidden_layers:
        raise CheckpointError(f"{path}: 'first_k_dense_replace' = {c.first_k_dense_replace}")


def llada2_config_from_hf(cfg: dict[str, Any], path: Path) -> LLaDA2Config:
    """Parse a `llada2_moe` `config.json` dict (read from `path`)."""
    _check_supported(cfg, path)
    hidden = _size(cfg, "hidden_size", path)
    heads = _size(cfg, "num_attention_heads", path)
    kv_heads = _size(cfg, "num_key_value_heads", path, heads)
    check_heads(heads, kv_heads, path)
    head_dim = _size(cfg, "head_dim", path, hidden // heads)
    vocab = _size(cfg, "vocab_size", path)
    tie = cfg.get("tie_word_embeddings")
    if tie is not None and not isinstance(tie, bool):
        raise CheckpointError(f"{path}: 'tie_word_embeddings' must be true or false, got {tie!r}")
    residual = cfg.get("orl_residual")
    out = LLaDA2Config(
        architecture=(cfg.get("architectures") or ["?"])[0],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_size(cfg, "intermediate_size", path),
        num_hidden_layers=_size(cfg, "num_hidden_layers", path),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rotary_dim=_rotary_dim(cfg, head_dim, path),
        rms_norm_eps=positive_float(_field(cfg, "rms_norm_eps", path, float), "rms_norm_eps", path),
        rope_theta=positive_float(_field(cfg, "rope_theta", path, float), "rope_theta", path),
        max_position_embeddings=_size(cfg, "max_position_embeddings", path),
        tie_word_embeddings=tie,
        mask_token_id=_mask_id(cfg, vocab, path),
        block_size=_size(cfg, "block_size", path, DEFAULT_BLOCK_LENGTH),
        eos_token_ids=_stop_ids(cfg, vocab, path),
        num_experts=_size(cfg, "num_experts", path),
        top_k=_field(cfg, "num_experts_per_tok", path),
        n_group=_field(cfg, "n_group", path),
        topk_group=_field(cfg, "topk_group", path),
        moe_intermediate_size=_size(cfg, "moe_intermediate_size", path),
        num_shared_experts=int(cfg.get("num_shared_experts") or 0),
        first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
        routed_scaling_factor=_field(cfg, "routed_scaling_factor", path, float),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        expert_bias=bool(cfg.get("moe_router_enable_expert_bias", True)),
        residual=None if residual is None else ResidualConfig.from_hf(residual, path),
    )
    _check_moe(out, path)
    return out
