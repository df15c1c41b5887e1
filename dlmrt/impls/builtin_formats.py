"""The built-in rows of the format table (`formats.py`): FP8 and NVFP4, their builders in
`dense_install.py` and `expert_install.py`. Imported by the package (`dlmrt/impls/__init__.py`), so
the table holds them before any install; its own module so that the table, the installer and
the builders import one another in one direction only."""

from __future__ import annotations

from dlmrt.formats.fp8 import Fp8Weight, quantize_per_channel
from dlmrt.formats.nvfp4 import Nvfp4Weight
from dlmrt.impls.dense_install import fp8_gated_mlp, fp8_linear, nvfp4_gated_mlp
from dlmrt.impls.expert_install import fp8_experts, nvfp4_experts
from dlmrt.impls.formats import FormatRow, register_format
from dlmrt.impls.norms import fp8_out_norm

register_format(
    Fp8Weight,
    FormatRow(
        "fp8",
        linear=fp8_linear,
        gated_mlp=fp8_gated_mlp,
        experts=fp8_experts,
        norm_out=fp8_out_norm,
        tied_copy=quantize_per_channel,
    ),
)
register_format(
    Nvfp4Weight,
    FormatRow("nvfp4", gated_mlp=nvfp4_gated_mlp, experts=nvfp4_experts),
)
