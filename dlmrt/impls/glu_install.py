"""Install the one-kernel gate|up + activation into a gated MLP where it measures faster: an FP8
one (`install_glu`) or one in the model dtype (`install_bf16_glu`).

Called by dense_install.py once a dense SwiGLU / GeGLU has both halves as `Fp8Linear`s:
`ops/fp8_glu_choice.py` times the separate and the fused form at the block rows; if fused wins,
the MLP's `gate_up` becomes a `FusedGlu` (kernels/fp8_glu_gemm.py) and its down projection the plan of
kernels/fp8_gemm.py that quantizes y as it loads it. Other row counts (a prefill) run the
separate form, so nothing else about the linears changes.

In the model dtype (`install_bf16_glu`, after `fuse_projections` and the quantized install): each
layer's dense MLP whose `gate_up` is a `dense.StackedGateUp` becomes a `dense.FusedGateUp` over the
same stacked weight where `ops/bf16_glu_choice.py` picks the one kernel at the block rows.
"""

from __future__ import annotations

import logging

from torch import nn

from dlmrt import envs
from dlmrt.impls.dense import FusedGateUp, StackedGateUp
from dlmrt.impls.fp8_linear import Fp8Linear
from dlmrt.impls.gate_up import FusedGlu
from dlmrt.impls.slot import set_slot
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops.bf16_glu_choice import use_bf16_glu
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


def block_rows(model: nn.Module) -> int:
    """The rows a model's layers run at in a round: a block (QwenDLM, LLaDA2) or a canvas
    (DiffusionGemma), as the quantized install measures them."""
    cfg = model.cfg
    rows = getattr(cfg, "block_size", None) or getattr(cfg, "canvas_length", None)
    if not rows:
        raise ValueError(f"{type(model).__name__}: its config has no block_size or canvas_length")
    return rows


def install_bf16_glu(model: nn.Module, rows: int | None = None) -> int:
    """Give each layer's dense gated MLP of `model` (`model.model.layers[i].mlp`, its `gate_up` a
    `StackedGateUp`) the one-kernel first half where it is chosen at `rows` (default: the block
    rows); returns how many were installed. Shared experts and adapters keep theirs. With
    DLMRT_BF16_GLU=off (the default) nothing is looked at or recorded: the load is as before."""
    if envs.bf16_glu() == "off":
        return 0
    done = 0
    for i, layer in enumerate(getattr(getattr(model, "model", None), "layers", ())):
        mlp = getattr(layer, "mlp", None)
        stacked = getattr(mlp, "gate_up", None)
        if not isinstance(stacked, StackedGateUp):
            continue  # routed experts, a quantized or unfused first half
        w, rows = stacked.weight, rows or block_rows(model)
        gelu = stacked.activation == "gelu_tanh"
        ok, why, config = use_bf16_glu(rows, w.shape[0] // 2, w.shape[1], w.device, w.dtype, gelu)
        log.debug(
            "layer %d mlp: gate|up + activation %s (%s)", i, "one kernel" if ok else "separate", why
        )
        if ok:
            plan = None if config is None else fp8_ops.GluPlan(rows, config)
            set_slot(mlp, "gate_up", FusedGateUp(w, stacked.activation, plan))
            done += 1
    return done
