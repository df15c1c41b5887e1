"""Install the one-kernel gate|up + activation into an FP8 gated MLP where it measures faster.

Called by dense_install.py once a dense SwiGLU / GeGLU has both halves as `Fp8Linear`s:
`ops/fp8_glu_choice.py` times the separate and the fused form at the block rows; if fused wins,
the MLP's `gate_up` becomes a `FusedGlu` (kernels/fp8_glu_gemm.py) and its down projection the plan of
kernels/fp8_gemm.py that quantizes y as it loads it. Other row counts (a prefill) run the
separate form, so nothing else about the linears changes.
"""

from __future__ import annotations

import logging

from torch import nn

from dlmrt.impls.fp8_linear import Fp8Linear
from dlmrt.impls.gate_up import FusedGlu
from dlmrt.impls.slot import set_slot
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops.fp8_glu_choice import use_glu

log = logging.getLogger("dlmrt")


def install_glu(name: str, mlp: nn.Module, rows: int) -> bool:
    """Give `mlp` (its `gate_up` a `QuantGateUp` of an Fp8Linear, its down_proj an Fp8Linear) the
    fused first half (`gate_up.FusedGlu`) if it times faster at `rows` rows; True if installed."""
    gate_up, down = getattr(mlp, "gate_up", None), mlp.down_proj
    linear = getattr(gate_up, "linear", None)
    if not (isinstance(linear, Fp8Linear) and isinstance(down, Fp8Linear)):
        return False
    gelu = mlp.activation == "gelu_tanh"
    device = linear.qweight.device
    two_i, k = linear.qweight.shape
    ok, why, glu, down_config = use_glu(rows, two_i // 2, k, down.out_features, device, gelu)
    log.debug("fp8 %s: gate|up + activation %s (%s)", name, "one kernel" if ok else "separate", why)
    if not ok or glu is None or down_config is None:
        return False
    set_slot(mlp, "gate_up", FusedGlu(linear, fp8_ops.GluPlan(rows, glu), gelu))
    down.set_plan(fp8_ops.GemmPlan.new(rows, down.out_features, down_config, device))
    return True
