"""Which kernel runs a canvas step's vocabulary pass, decided once per canvas program and
recorded in the choices registry under "canvas vocabulary".

"rows": kernels/canvas_vocab.py, one program per canvas row (256 programs on an H100's 132 SMs at
DiffusionGemma's canvas). "split": kernels/canvas_vocab_split.py, each row's vocabulary split
over several programs (rows x splits from the SM count), the same outputs up to the order of fp32
additions (argmax exact; a sampled token differs only on a draw within rounding of a step of
the cumulative sum). "onepass": the LM head, the pass and the self-conditioning GEMM p @ E in one
stream over the vocabulary from the final normed hidden (`ops.canvas_vocab_pass`,
kernels/canvas_vocab_pass.py; the step then keeps p @ E [rows, hidden] instead of p [rows,
vocab]), for a plain floating-point head whose weight has the embedding's dtype (an FP8 or
NVFP4 head keeps its own GEMM and "split"). DLMRT_CANVAS_VOCAB pins it; "split" by default, as
measured on an H100 (`benchmarks/kernels/canvas_vocab_split.py`, `canvas_vocab_pass.py`:
benchmarks/results/canvas_vocab_split_h100_2026-12-05.json, canvas_vocab_pass_h100_2026-12-05.json:
split 0.445 ms, rows 0.506, the one pass 8.9 ms against 1.6 for the head + pass + GEMM). Tensor
parallelism uses none of them (the step combines its statistics across the vocabulary shards).
"""

from __future__ import annotations

from torch import nn

from dlmrt import envs, ops
from dlmrt.ops import choices
from dlmrt.parallel import group as tp


def _one_pass_misfit(model: nn.Module) -> str | None:
    """Why `model`'s head cannot run in the one pass, or None."""
    head = model.lm_head
    if type(head) is not nn.Linear or head.bias is not None:
        return f"the LM head is {type(head).__name__}: it keeps its own GEMM"
    weight = head.weight
    if not weight.is_floating_point() or weight.dtype != model.embed_table.dtype:
        return f"the LM head's {weight.dtype} weight is not the embedding's dtype"
    return None


def canvas_vocab_kernel(model: nn.Module) -> str:
    """ "rows", "split" or "onepass": what a canvas step of `model` runs for its vocabulary on
    CUDA, for the canvas programs built from now on (recorded; the CPU runs the torch twins)."""
    if tp.active() is not None:
        return choices.record("canvas vocabulary", "rows", "tensor parallel: op unused").pick
    pick = envs.canvas_vocab()
    op = "canvas_vocab_pass" if pick == "onepass" else "canvas_vocab"
    why = f"DLMRT_CANVAS_VOCAB={pick}: op {ops.implementation(op)}"
    misfit = _one_pass_misfit(model) if pick == "onepass" else None
    if misfit is not None:
        pick, why = "split", f"DLMRT_CANVAS_VOCAB=onepass, but {misfit}"
    return choices.record("canvas vocabulary", pick, why).pick
