"""The table of quantized formats: one row per weight type, the builders of its implementation
objects for each layer kind (`dlmrt/impls/__init__.py`). `install.py` walks a model's layers and
asks the row of each site's weights to build what runs there; a site whose row has no builder
for its kind is declined (the loader dequantizes its weights into the bf16 parameters).

A row's builders (each may decline by returning None / []):
    linear(ins, names, weights, fused_input) -> module     one GEMM over the stacked `weights`
                                                           (`fused_input`: the producer of x can
                                                           hand it over already quantized)
    gated_mlp(ins, prefix, mlp, producer) -> names done    the MLP's `gate_up` and `down_proj`
                                                           (default: `generic_gated_mlp`)
    experts(ins, prefix, experts, top_k) -> names done     the `experts.impl` slot
    norm_out                                               the `norm.impl` that feeds this
                                                           format's linears their input
    tied_copy(weight) -> weight                            a tied LM head's copy in this format

The built-in rows (FP8, NVFP4) are registered by `builtin_formats.py`. Adding a format: its container (`dlmrt/formats/`), its reader, its implementation objects and
kernels, and `register_format(WeightType, FormatRow(...))` — no model file changes
(docs/quantized-layers.md walks through one; tests/quant/test_toy_format.py registers one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FormatRow:
    name: str
    linear: Callable[..., Any] | None = None
    gated_mlp: Callable[..., list[str]] | None = None
    experts: Callable[..., list[str]] | None = None
    norm_out: Callable[..., Any] | None = None
    tied_copy: Callable[[Any], Any] | None = None


TABLE: dict[type, FormatRow] = {}


def register_format(weight_type: type, row: FormatRow) -> None:
    """Add (or replace) the row of `weight_type`: installs of later loads use it."""
    TABLE[weight_type] = row


def unregister_format(weight_type: type) -> None:
    TABLE.pop(weight_type, None)
