"""Which kernel runs a canvas step's vocabulary pass (`ops.canvas_vocab`), decided once per
canvas program and recorded in the choices registry under "canvas vocabulary".

"rows": kernels/canvas_vocab.py, one program per canvas row (256 programs on an H100's 132 SMs at
DiffusionGemma's canvas). "split": kernels/canvas_vocab_split.py, each row's vocabulary split
over several programs (rows x splits from the SM count), the same outputs up to the order of fp32
additions (argmax exact; a sampled token differs only on a draw within rounding of a step of
the cumulative sum). DLMRT_CANVAS_VOCAB pins it; "rows" by default until the two are measured
on the GPU (`benchmarks/kernels/canvas_vocab_split.py`). Tensor parallelism does not use the op
(the step combines its statistics across the vocabulary shards).
"""

from __future__ import annotations

from dlmrt import envs, ops
from dlmrt.ops import choices
from dlmrt.parallel import group as tp


def canvas_vocab_kernel() -> str:
    """ "rows" or "split": the kernel `ops.canvas_vocab` runs on CUDA for the canvas programs
    built from now on (recorded; the CPU runs the torch twin for either)."""
    if tp.active() is not None:
        return choices.record("canvas vocabulary", "rows", "tensor parallel: op unused").pick
    pick = envs.canvas_vocab()
    why = f"DLMRT_CANVAS_VOCAB={pick}: op {ops.implementation('canvas_vocab')}"
    return choices.record("canvas vocabulary", pick, why).pick
