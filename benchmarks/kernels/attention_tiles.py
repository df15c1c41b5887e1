"""Attention tiles and key splits at the models' round shapes (one H200, bf16).

python -m benchmarks.kernels.attention_tiles [--out results/attention_tiles_h200_DATE.json]

For LLaDA-2.1-mini (32 rows, 16 / 4 heads x 128) and QwenDLM-4B (256 rows, 32 / 8 x 128), at
contexts 1k and 4k: the one-pass kernel (`kernels/arena_attention.py`) under each candidate
(BLOCK_M, BLOCK_N, num_warps, num_stages) and the split-KV kernel under each split count. A case
is `LAYERS` back-to-back calls on distinct arena layers captured in one CUDA graph (as a round
runs them), so a call's time includes its launch inside a graph but not a graph launch. Reports
us per call, the shipped choice (`tile_config`, `pick_splits`), and the floors: FLOPs
(4 rows keys heads dim at 790 TFLOP/s) and bytes (K and V of the visible keys at the device's copy bandwidth (`common.PEAK_BYTES`)).
DiffusionGemma-26B-A4B's canvas attention (`kernels/canvas_attention.py`, 256 rows, sliding layers
16 / 8 x 256 with a 1,024 window, full layers 16 / 2 x 512) under its candidate (BLOCK_M, BLOCK_N,
BLOCK_D, BLOCK_DV, num_warps, num_stages, splits): the `canvas` rows.
"""

from __future__ import annotations

import torch

from benchmarks.common import (
    PEAK_BYTES,
    block_attention_shape,
    canvas_attention_shape,
    command_line,
    graph_ms,
    iters_parser,
    write_result,
)
from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini, qwen_dlm_4b
from dlmrt.models.diffusion_gemma_config import FULL, SLIDING

LAYERS, ARENA, PEAK_FLOPS = 16, 8192, 790e12
SHAPES = {  # rows, heads, kv heads
    "llada2_32": block_attention_shape(llada21_mini()),
    "qwen_dlm_256": block_attention_shape(qwen_dlm_4b()),
}
TILES = {
    32: [(32, 64, 4, 3), (32, 128, 4, 3), (64, 128, 4, 3)],
    256: [(64, 64, 4, 3), (64, 128, 4, 3), (64, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 3)],
}  # fmt: skip
SPLITS = {32: [2, 4, 8, 16], 256: [2, 4]}


def _per_call_us(fn, iters: int) -> float:
    """µs per layer call of fn (LAYERS calls), replayed from one CUDA graph."""
    return graph_ms(fn, iters) * 1e3 / LAYERS


def case(name: str, context: int, iters: int) -> dict:
    from dlmrt._kernels.arena_attention import arena_attention, tile_config
    from dlmrt._kernels.arena_attention_split import pick_splits
    from dlmrt._kernels.device import sm_count

    rows, heads, kv_heads = SHAPES[name]
    gen = torch.Generator("cuda").manual_seed(context)
    q = torch.randn(heads, rows, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    kv = torch.randn(
        2, LAYERS, kv_heads, ARENA, 128, device="cuda", generator=gen, dtype=torch.bfloat16
    )
    pos = torch.arange(context, context + rows, device="cuda")
    ref = arena_attention(q, kv[0, 0], kv[1, 0], pos, rows, 0.088, splits=1)

    def run(**kw):
        try:
            return _run(**kw)
        except Exception as exc:  # a tile that does not fit (shared memory): recorded, skipped
            return f"failed: {type(exc).__name__}: {str(exc)[:120]}", 0.0

    def _run(**kw):
        def fn():
            for layer in range(LAYERS):
                arena_attention(q, kv[0, layer], kv[1, layer], pos, rows, 0.088, **kw)

        out = arena_attention(q, kv[0, 0], kv[1, 0], pos, rows, 0.088, **kw)
        return round(_per_call_us(fn, iters), 2), float((out.float() - ref.float()).abs().max())

    keys = context + rows
    row = {
        "case": name, "context": context,
        "shipped_tiles": list(tile_config(rows, 128, False)),
        "shipped_splits": pick_splits(rows, heads, ARENA, sm_count(q.device)),
        "floor_flops_us": round(4 * rows * keys * heads * 128 / PEAK_FLOPS * 1e6, 2),
        "floor_bytes_us": round(2 * kv_heads * keys * 128 * 2 / PEAK_BYTES * 1e6, 2),
        "tiles_us": {}, "splits_us": {}, "max_abs_diff": 0.0,
    }  # fmt: skip
    for tiles in TILES[rows]:
        us, diff = run(splits=1, tiles=tiles)
        row["tiles_us"]["x".join(map(str, tiles))] = us
        row["max_abs_diff"] = max(row["max_abs_diff"], diff)
    for splits in SPLITS[rows]:
        us, diff = run(splits=splits)
        row["splits_us"][str(splits)] = us
        row["max_abs_diff"] = max(row["max_abs_diff"], diff)
    print(row, flush=True)
    return row


CANVAS = {  # heads, kv, dim, window
    "dg_sliding": canvas_attention_shape(diffusion_gemma_26b(), SLIDING),
    "dg_full": canvas_attention_shape(diffusion_gemma_26b(), FULL),
}
CANVAS_TILES = {
    256: [(64, 32, 128, 128, 4, 3, 1), (64, 64, 128, 128, 4, 3, 1), (64, 64, 128, 128, 4, 3, 2),
          (64, 64, 128, 256, 8, 2, 2), (64, 64, 256, 128, 4, 2, 1)],
    512: [(64, 32, 128, 128, 4, 3, 1), (64, 32, 128, 256, 8, 3, 1), (64, 32, 128, 512, 8, 2, 1),
          (64, 32, 128, 512, 8, 2, 2), (64, 32, 128, 512, 8, 2, 4), (32, 32, 128, 512, 4, 2, 2)],
}  # fmt: skip


def canvas_case(name: str, context: int, iters: int) -> dict:
    from dlmrt._kernels.canvas_attention import canvas_attention, launch_tile

    from dlmrt.ops import canvas

    heads, kv_heads, dim, window = CANVAS[name]
    rows = 256
    gen = torch.Generator("cuda").manual_seed(context + dim)
    q = torch.randn(heads, rows, dim, device="cuda", generator=gen, dtype=torch.bfloat16)
    kv = torch.randn(
        2,
        LAYERS,
        kv_heads,
        context + rows + 64,
        dim,
        device="cuda",
        generator=gen,
        dtype=torch.bfloat16,
    )
    pos = torch.arange(context, context + rows, device="cuda")
    ref = canvas.canvas_attention(
        q.float(), kv[0, 0].float(), kv[1, 0].float(), pos, True, window, 1.0
    )
    keys = context + rows if window == 0 else min(context, window - 1) + rows
    row = {
        "case": name, "context": context, "shipped_tiles": list(launch_tile(dim, False)),
        "floor_flops_us": round(4 * rows * keys * heads * dim / PEAK_FLOPS * 1e6, 2),
        "floor_bytes_us": round(2 * kv_heads * keys * dim * 2 / PEAK_BYTES * 1e6, 2),
        "tiles_us": {}, "max_abs_diff": 0.0,
    }  # fmt: skip
    for tiles in [None] + CANVAS_TILES[dim]:

        def fn(tiles=tiles):
            for layer in range(LAYERS):
                canvas_attention(q, kv[0, layer], kv[1, layer], pos, True, window, 1.0, tiles)

        try:
            out = canvas_attention(q, kv[0, 0], kv[1, 0], pos, True, window, 1.0, tiles)
            us = round(_per_call_us(fn, iters), 2)
        except Exception as exc:  # a tile that does not fit (shared memory): recorded, skipped
            row["tiles_us"][str(tiles)] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
            continue
        row["tiles_us"]["shipped" if tiles is None else "x".join(map(str, tiles))] = us
        diff = float((out.float() - ref).abs().max())
        row["max_abs_diff"] = max(row["max_abs_diff"], diff)
    print(row, flush=True)
    return row


def main() -> None:
    ap = iters_parser(__doc__, 30, "benchmarks/results/attention_tiles.json")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    args = ap.parse_args()
    rows = [case(name, c, args.iters) for name in SHAPES for c in args.contexts]
    rows += [canvas_case(name, c, args.iters) for name in CANVAS for c in args.contexts]
    write_result(
        args.out,
        {
            "benchmark": "attention_tiles",
            "command": command_line(),
            "layers_per_graph": LAYERS,
            "results": rows,
        },
        args.git_revision,
    )


if __name__ == "__main__":
    main()
