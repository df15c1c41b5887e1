"""ModelConfig: the backbone fields dlmrt reads from an HF `config.json` (the only place that reads them).

Every value comes from the checkpoint; a missing required field raises `CheckpointError` naming the
field and the file. Family-specific extras (the ORL adapter) are parsed by their own modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlmrt.errors import CheckpointError
from dlmrt.models.residual import ResidualConfig

DEFAULT_BLOCK_LENGTH = (
    256  # QwenDLM trains with 256-token blocks; used when config has no block_size
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Dense Qwen3-style backbone with block-diffusion attention (QwenDLM / SDAR)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool | None  # None: not stated, tie iff `lm_head.weight` is absent
    mask_token_id: int | None
    block_size: int
    eos_token_ids: tuple[int, ...] = ()
    residual: ResidualConfig | None = None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def with_local_heads(self, heads: int, kv_heads: tuple[int, ...]) -> ModelConfig:
        """This config as one tensor-parallel rank sees it: `heads` query heads and, per layer,
        `kv_heads` (the same in every layer here), so the engines size the KV arena per rank."""
        return replace(self, num_attention_heads=heads, num_key_value_heads=kv_heads[0])


def _field(cfg: dict[str, Any], name: str, path: Path, kind: type = int) -> Any:
    if name not in cfg or cfg[name] is None:
        raise CheckpointError(f"{path}: missing required config field '{name}'")
    value = cfg[name]
    if kind is int and (
        isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())
    ):
        raise CheckpointError(f"{path}: config field '{name}' = {value!r} is not an integer")
    try:
        return kind(value)
    except (TypeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: config field '{name}' = {value!r} is not {kind.__name__}"
        ) from e


def positive_float(value: float, name: str, path: Path) -> float:
    """A scale that must be finite and > 0 (rms_norm_eps, rope_theta): a NaN, an infinity or a
    non-positive value would only show up as non-finite logits at run time."""
    if not math.isfinite(value) or value <= 0:
        raise CheckpointError(f"{path}: config field '{name}' = {value!r} must be finite and > 0")
    return value


def positive(value: int, name: str, path: Path) -> int:
    """A size that must be >= 1 (a zero or negative size is a config error naming the field)."""
    if value < 1:
        raise CheckpointError(f"{path}: config field '{name}' = {value} must be >= 1")
    return value


def _size(cfg: dict[str, Any], name: str, path: Path, default: int | None = None) -> int:
    """A required (or, with `default`, optional) integer size field, >= 1."""
    if default is not None and cfg.get(name) is None:
        return positive(default, name, path)
    return positive(_field(cfg, name, path), name, path)


def check_heads(heads: int, kv_heads: int, path: Path) -> None:
    if heads % kv_heads:
        raise CheckpointError(
            f"{path}: 'num_attention_heads' = {heads} is not a multiple of "
            f"'num_key_value_heads' = {kv_heads}"
        )


def _rope_theta(cfg: dict[str, Any], path: Path) -> float:
    # transformers >= 5 nests RoPE under `rope_parameters`; older configs have top-level `rope_theta`.
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
    if kind not in ("default", None):
        raise CheckpointError(f"{path}: rope type '{kind}' is not supported (only default RoPE)")
    if isinstance(rope, dict) and "rope_theta" in rope:
        return float(rope["rope_theta"])
    return _field(cfg, "rope_theta", path, float)


def eos_ids(value: Any, path: Path | None = None, vocab: int | None = None) -> tuple[int, ...]:
    """Normalise an `eos_token_id` field (int, list of ints or None) to a tuple; with `vocab`,
    every id must be a token id in [0, vocab)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in items
    ):
        raise CheckpointError(
            f"{path or 'config'}: 'eos_token_id' must be an int or a list of ints, got {value!r}"
        )
    outside = [v for v in items if vocab is not None and not 0 <= v < vocab]
    if outside:
        raise CheckpointError(
            f"{path or 'config'}: 'eos_token_id' {outside} is not a token id in [0, {vocab})"
        )
    return tuple(items)


def _optional_id(cfg: dict[str, Any], name: str, vocab: int, path: Path) -> int | None:
    value = cfg.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise CheckpointError(f"{path}: '{name}' = {value!r} is not a token id in [0, {vocab})")
    return value


def _check_supported(cfg: dict[str, Any], path: Path) -> None:
    """Options of the Qwen3 / SDAR key set the model does not implement, refused by name (their
    released values: silu, no bias, no sliding window)."""
    unsupported = {
        "hidden_act": cfg.get("hidden_act", "silu") != "silu",
        "attention_bias": cfg.get("attention_bias") is True,
        "use_sliding_window": cfg.get("use_sliding_window") is True,
    }
    for name, bad in unsupported.items():
        if bad:
            raise CheckpointError(f"{path}: config field '{name}' = {cfg[name]!r} is not supported")


def model_config_from_hf(cfg: dict[str, Any], path: Path) -> ModelConfig:
    """Parse a QwenDLM/SDAR/Qwen3 `config.json` dict (read from `path`)."""
    _check_supported(cfg, path)
    hidden = _size(cfg, "hidden_size", path)
    heads = _size(cfg, "num_attention_heads", path)
    kv_heads = _size(cfg, "num_key_value_heads", path, heads)
    check_heads(heads, kv_heads, path)
    head_dim = _size(cfg, "head_dim", path, hidden // heads)
    residual = cfg.get("orl_residual")
    tie = cfg.get("tie_word_embeddings")
    if tie is not None and not isinstance(tie, bool):
        raise CheckpointError(f"{path}: 'tie_word_embeddings' must be true or false, got {tie!r}")
    vocab = _size(cfg, "vocab_size", path)
    return ModelConfig(
        architecture=(cfg.get("architectures") or ["?"])[0],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_size(cfg, "intermediate_size", path),
        num_hidden_layers=_size(cfg, "num_hidden_layers", path),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=positive_float(_field(cfg, "rms_norm_eps", path, float), "rms_norm_eps", path),
        rope_theta=positive_float(_rope_theta(cfg, path), "rope_theta", path),
        max_position_embeddings=_size(cfg, "max_position_embeddings", path),
        tie_word_embeddings=tie,
        mask_token_id=_optional_id(cfg, "mask_token_id", vocab, path),
        block_size=_size(cfg, "block_size", path, DEFAULT_BLOCK_LENGTH),
        eos_token_ids=eos_ids(cfg.get("eos_token_id"), path, vocab),
        residual=None if residual is None else ResidualConfig.from_hf(residual, path),
    )
