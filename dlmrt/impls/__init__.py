"""Implementation objects: how each layer kind of a model runs, chosen once at load.

A model's forward calls a slot and never asks how its weights are stored. The slots, by layer kind:

    linear      a module called on x: `nn.Linear` (bf16), `Fp8Linear`, `Nvfp4Linear`, or a stack of
                projections as one GEMM (`Attention.qkv`: `dense.ProjectionConcat` before fusing,
                `dense.StackedProjection` after, or one quantized linear)
    gated MLP   `mlp.gate_up`: x -> act(gate x) * up x, the down projection's input
                (`dense.SeparateGateUp` / `StackedGateUp` / `FusedGateUp`, `gate_up.QuantGateUp`,
                `gate_up.FusedGlu`);
                `mlp.down_proj` a linear as above
    experts     `experts.impl(experts, x, weights, index, sum_dtype, add)`: `experts.DenseExperts`
                (bf16, or FP8 codes weight-only), `W8A8Experts`, `Nvfp4Experts`
    norm        `norm.impl(x, residual, weight, eps)`: `norms.plain_norm`, or `norms.fp8_out_norm`
                where every consumer of the norm is an FP8 GEMM that takes its codes

The bf16 defaults are set when a model is built; `install.install_quantized` replaces them for a
quantized checkpoint, one format at a time through the table in `formats.py` (a format = one row).
This package never imports `dlmrt.models`: it sees modules by the slots above.
"""

import dlmrt.impls.builtin_formats  # noqa: E402, F401  (registers the FP8 and NVFP4 rows)
