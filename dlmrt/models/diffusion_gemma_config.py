"""DiffusionGemma's text config (`text_config` of a `DiffusionGemmaForBlockDiffusion` config.json).

Every value comes from the file; a missing or malformed field is a CheckpointError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlmrt.errors import CheckpointError
from dlmrt.models.config import _field, eos_ids, positive, positive_float

SLIDING, FULL = "sliding_attention", "full_attention"
DEFAULT_SOFTCAP = 30.0  # transformers' DiffusionGemmaTextConfig class default (not serialised)


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeSpec:
    theta: float
    rotary_factor: float = 1.0  # "proportional": share of the head dim that rotates
    factor: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffusionGemmaConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # dense GeGLU branch
    self_conditioning_size: int
    num_attention_heads: int
    layer_types: tuple[str, ...]
    head_dims: tuple[int, ...]  # per layer (full layers: the global head dim)
    kv_heads: tuple[int, ...]  # per layer (full layers: num_global_key_value_heads)
    rope: dict[str, RopeSpec]  # per layer type
    sliding_window: int
    rms_norm_eps: float
    num_experts: int
    top_k_experts: int
    moe_intermediate_size: int
    final_logit_softcapping: float | None
    max_position_embeddings: int
    canvas_length: int
    tie_word_embeddings: bool | None
    pad_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # image placeholder / begin / end ids: the engine is text-only, so a prompt holding them is refused
    image_token_ids: tuple[int, ...] = ()

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)

    def with_local_heads(self, heads: int, kv_heads: tuple[int, ...]) -> DiffusionGemmaConfig:
        """This config as one tensor-parallel rank sees it: its KV heads per layer (the KV
        arena's widths); the query heads live in the attention modules."""
        return replace(self, kv_heads=kv_heads)


def _get(tc: dict[str, Any], name: str, path: Path, kind: type = int) -> Any:
    if tc.get(name) is None:
        raise CheckpointError(f"{path}: missing required config field 'text_config.{name}'")
    return _field(tc, name, path, kind)


def _size(tc: dict[str, Any], name: str, path: Path) -> int:
    """A required `text_config` size, >= 1."""
    return positive(_get(tc, name, path), f"text_config.{name}", path)


def _rope(tc: dict[str, Any], path: Path) -> dict[str, RopeSpec]:
    params = tc.get("rope_parameters")
    out = {}
    for kind in sorted(set(tc["layer_types"])):
        spec = params.get(kind) if isinstance(params, dict) else None
        if not isinstance(spec, dict) or "rope_theta" not in spec:
            raise CheckpointError(
                f"{path}: missing 'text_config.rope_parameters.{kind}.rope_theta'"
            )
        rtype, prf = spec.get("rope_type", "default"), float(spec.get("partial_rotary_factor", 1.0))
        if rtype not in ("default", "proportional") or (rtype == "default" and prf != 1.0):
            raise CheckpointError(f"{path}: unsupported RoPE for {kind}: {spec}")
        factor = float(spec.get("factor", 1.0)) if rtype == "proportional" else 1.0
        theta = positive_float(
            float(spec["rope_theta"]), f"rope_parameters.{kind}.rope_theta", path
        )
        out[kind] = RopeSpec(theta=theta, rotary_factor=prf, factor=factor)
    return out


def _per_layer_overrides(per_layer: dict[Any, Any], types: list[str], path: Path) -> dict:
    """`per_layer_config` keyed by layer index: keys in any spelling ("5", "05", 5; transformers
    5.17 zero-pads them), each in range and given once; every full layer must have one."""
    where = f"{path}: 'text_config.per_layer_config'"
    out: dict[int, dict[str, Any]] = {}
    for key, over in per_layer.items():
        try:
            index = int(str(key).strip())
        except ValueError:
            raise CheckpointError(f"{where}: key {key!r} is not a layer index") from None
        if not 0 <= index < len(types):
            raise CheckpointError(f"{where}: layer {key!r} is outside [0, {len(types)})")
        if index in out:
            raise CheckpointError(f"{where}: layer {index} is given twice")
        if not isinstance(over, dict):
            raise CheckpointError(f"{where}: layer {key!r} is not an object")
        out[index] = over
    missing = [
        i for i, kind in enumerate(types) if kind == FULL and "head_dim" not in out.get(i, {})
    ]
    if missing:
        raise CheckpointError(f"{where}: no head_dim override for {FULL} layer(s) {missing}")
    return out


def _layer_shapes(tc: dict[str, Any], path: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-layer (head_dim, kv_heads): `per_layer_config` as transformers saves it, else the
    `global_head_dim` / `num_global_key_value_heads` fields on full layers."""
    head_dim, kv = _size(tc, "head_dim", path), _size(tc, "num_key_value_heads", path)
    per_layer = tc.get("per_layer_config")
    if isinstance(per_layer, dict):
        overrides = _per_layer_overrides(per_layer, tc["layer_types"], path)
    dims, heads = [], []
    for i, kind in enumerate(tc["layer_types"]):
        if isinstance(per_layer, dict):
            over = overrides.get(i, {})
        elif kind == FULL:
            over = {"head_dim": _get(tc, "global_head_dim", path)}
            over["num_key_value_heads"] = tc.get("num_global_key_value_heads") or kv
        else:
            over = {}
        dims.append(int(over.get("head_dim", head_dim)))
        heads.append(int(over.get("num_key_value_heads", kv)))
    for i, (dim, kv_heads) in enumerate(zip(dims, heads, strict=True)):
        positive(dim, f"text_config.head_dim of layer {i}", path)
        positive(kv_heads, f"text_config.num_key_value_heads of layer {i}", path)
    return tuple(dims), tuple(heads)


def diffusion_gemma_config_from_hf(cfg: dict[str, Any], path: Path) -> DiffusionGemmaConfig:
    tc = cfg.get("text_config")
    if not isinstance(tc, dict):
        raise CheckpointError(f"{path}: missing required config field 'text_config'")
    types = tc.get("layer_types")
    if not isinstance(types, list) or not types or set(types) - {SLIDING, FULL}:
        raise CheckpointError(f"{path}: 'text_config.layer_types' must list {SLIDING}/{FULL}")
    if len(types) != _size(tc, "num_hidden_layers", path):
        raise CheckpointError(f"{path}: 'text_config.layer_types' length != num_hidden_layers")
    if tc.get("hidden_activation") != "gelu_pytorch_tanh" or tc.get("attention_bias"):
        raise CheckpointError(f"{path}: only gelu_pytorch_tanh, bias-free models are supported")
    if tc.get("use_bidirectional_attention") not in (None, "vision"):
        raise CheckpointError(f"{path}: use_bidirectional_attention='all' is not supported")
    dims, heads = _layer_shapes(tc, path)
    n_heads = _size(tc, "num_attention_heads", path)
    tie = cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings"))
    softcap = tc.get("final_logit_softcapping", DEFAULT_SOFTCAP)
    inter = _size(tc, "intermediate_size", path)
    vocab = _size(tc, "vocab_size", path)
    return DiffusionGemmaConfig(
        architecture=(cfg.get("architectures") or ["?"])[0],
        vocab_size=vocab,
        hidden_size=_size(tc, "hidden_size", path),
        intermediate_size=inter,
        self_conditioning_size=positive(
            int(tc.get("self_conditioning_size") or inter),
            "text_config.self_conditioning_size",
            path,
        ),
        num_attention_heads=n_heads,
        layer_types=tuple(types),
        head_dims=dims,
        kv_heads=heads,
        rope=_rope(tc, path),
        sliding_window=_size(tc, "sliding_window", path),
        rms_norm_eps=positive_float(_get(tc, "rms_norm_eps", path, float), "rms_norm_eps", path),
        num_experts=_size(tc, "num_experts", path),
        top_k_experts=_size(tc, "top_k_experts", path),
        moe_intermediate_size=_size(tc, "moe_intermediate_size", path),
        final_logit_softcapping=None if softcap is None else float(softcap),
        max_position_embeddings=_size(tc, "max_position_embeddings", path),
        canvas_length=positive(_field(cfg, "canvas_length", path), "canvas_length", path),
        tie_word_embeddings=tie if isinstance(tie, bool) else None,
        pad_token_id=tc.get("pad_token_id"),
        eos_token_ids=eos_ids(cfg.get("eos_token_id", tc.get("eos_token_id")), path, vocab),
        image_token_ids=tuple(
            int(cfg[k]) for k in ("image_token_id", "boi_token_id", "eoi_token_id") if k in cfg
        ),
    )
