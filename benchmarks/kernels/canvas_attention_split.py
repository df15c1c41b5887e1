"""DiffusionGemma's canvas attention: the whole kernel vs the key range split over the SMs.

python -m benchmarks.kernels.canvas_attention_split [--iters 30] [--contexts 1024,4096]
    [--splits 2,3,4,6,8,12,16] [--out results/canvas_attention_split_h100_DATE.json]

At DiffusionGemma-26B-A4B's shape (`dlmrt/model_shapes.py`: a 256-row canvas, 16 query heads;
sliding layers 8 KV heads x 256 with a 1,024 window, full layers 2 x 512) and each context, bf16,
a canvas (decoder) pass: `kernels/canvas_attention.py` at its shipped tiles and splits
(DLMRT_CANVAS_ATTN=whole), `kernels/canvas_attention_split.py` at the split count `pick_splits`
takes from the SM count (DLMRT_CANVAS_ATTN=split) and at each count of --splits (to retune WAVES
and MIN_TILES), and the whole kernel at 32-row tiles (twice the programs, K and V read twice,
no partials). A case is LAYERS back-to-back calls on distinct arena layers replayed from one
CUDA graph (as a step runs them): µs per layer call. Reports the FLOP floor per layer (4 rows
keys heads dim at `common.PEAK_FLOPS`), each path's ratio to it, the split kernel's largest
difference from the whole kernel, and the step's canvas attention (the model's sliding and full
layer counts) with each default path.
"""

from __future__ import annotations

import torch

from benchmarks.common import (
    PEAK_FLOPS,
    canvas_attention_shape,
    command_line,
    graph_ms,
    iters_parser,
    write_result,
)
from dlmrt.model_shapes import diffusion_gemma_26b
from dlmrt.models.diffusion_gemma_config import FULL, SLIDING

ROWS, LAYERS = 256, 8


def _inputs(kind: str, context: int) -> tuple[torch.Tensor, ...]:
    heads, kv_heads, dim, _ = canvas_attention_shape(diffusion_gemma_26b(), kind)
    gen = torch.Generator("cuda").manual_seed(context + dim)
    q = torch.randn(heads, ROWS, dim, device="cuda", generator=gen, dtype=torch.bfloat16)
    shape = (2, LAYERS, kv_heads, context + ROWS + 64, dim)
    kv = torch.randn(*shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    return q, kv, torch.arange(context, context + ROWS, device="cuda")


def _us(fn, iters: int) -> float:
    """µs per layer call of fn (LAYERS calls), replayed from one CUDA graph."""
    return round(graph_ms(fn, iters) * 1e3 / LAYERS, 2)


def case(kind: str, context: int, sweep: list[int], iters: int) -> dict:
    """Every path at DiffusionGemma's `kind` layers over `context` keys before the canvas."""
    from dlmrt._kernels import canvas_attention as whole
    from dlmrt._kernels import canvas_attention_split as split

    heads, _, dim, window = canvas_attention_shape(diffusion_gemma_26b(), kind)
    q, kv, pos = _inputs(kind, context)
    keys = context + ROWS if window == 0 else min(context, window - 1) + ROWS
    floor_us = 4 * ROWS * keys * heads * dim / PEAK_FLOPS * 1e6
    default = split.default_splits(q, kv[0, 0], window)

    def layers(run):
        return lambda: [run(kv[0, i], kv[1, i]) for i in range(LAYERS)]

    paths = {
        "whole": lambda k, v: whole.canvas_attention(q, k, v, pos, True, window, 1.0),
        f"split (default: {default})": lambda k, v: split.canvas_attention(
            q, k, v, pos, True, window, 1.0
        ),
    }
    rows32 = (32,) + whole.launch_tile(dim, False)[1:]  # more programs without partials
    paths["whole, 32-row tiles"] = lambda k, v: whole.canvas_attention(
        q, k, v, pos, True, window, 1.0, rows32
    )
    for n in sweep:
        paths[f"split {n}"] = lambda k, v, n=n: split.canvas_attention(
            q, k, v, pos, True, window, 1.0, n
        )
    row = {"kind": kind, "context": context, "keys": keys, "default_splits": default}
    row["floor_us"] = round(floor_us, 2)
    row["paths"] = []
    for name, run in paths.items():
        us = _us(layers(run), iters)
        row["paths"].append({"path": name, "us": us, "x_floor": round(us / floor_us, 2)})
    one = whole.canvas_attention(q, kv[0, 0], kv[1, 0], pos, True, window, 1.0)
    out = split.canvas_attention(q, kv[0, 0], kv[1, 0], pos, True, window, 1.0)
    row["max_abs_diff"] = float((out.float() - one.float()).abs().max())
    return row


def step_totals(rows: list[dict]) -> dict:
    """The step's canvas attention (µs) per context: whole and default split, and the floor."""
    types = diffusion_gemma_26b().layer_types
    count = {kind: sum(t == kind for t in types) for kind in (SLIDING, FULL)}
    out = {}
    for context in sorted({r["context"] for r in rows}):
        at = [r for r in rows if r["context"] == context]
        total = {"whole": 0.0, "split": 0.0, "floor": 0.0}
        for r in at:
            n = count[r["kind"]]
            total["whole"] += n * r["paths"][0]["us"]
            total["split"] += n * r["paths"][1]["us"]
            total["floor"] += n * r["floor_us"]
        out[str(context)] = {k: round(v, 1) for k, v in total.items()}
    return out


def main() -> None:
    ap = iters_parser(__doc__, 30)
    ap.add_argument("--contexts", default="1024,4096", help="context lengths before the canvas")
    ap.add_argument("--splits", default="2,3,4,6,8,12,16", help="split counts to sweep")
    args = ap.parse_args()
    sweep = [int(s) for s in args.splits.split(",") if s]
    rows = []
    for context in [int(c) for c in args.contexts.split(",") if c]:
        for kind in (SLIDING, FULL):
            row = case(kind, context, sweep, args.iters)
            for path in row["paths"]:
                print(f"{kind:>18} {context:>5} {path['path']:>20}: {path['us']:8.2f} us "
                      f"({path['x_floor']}x the floor {row['floor_us']} us)")  # fmt: skip
            rows.append(row)
    totals = step_totals(rows)
    print("step canvas attention (us):", totals, flush=True)
    if args.out:
        result = {"command": command_line(), "rows": rows, "step_us": totals}
        write_result(args.out, result, args.git_revision)


if __name__ == "__main__":
    main()
