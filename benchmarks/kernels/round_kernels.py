"""Issue 14's kernels against the paths they replace, at the real shapes (one H200, bf16).

python -m benchmarks.kernels.round_kernels [--iters 50] [--out results/round_kernels_h200_DATE.json]

Each case is one attention call over one arena layer, every path replayed as a CUDA graph:
- DiffusionGemma-26B-A4B canvas (256 rows, decoder pass, 16 q heads): sliding layers (8 KV heads
  x 256, window 1024) and full layers (2 KV heads x 512) at contexts 1k / 4k / 16k in a 20k arena:
  `ops.canvas_attention` kernel vs its twin (masked SDPA over the arena, the old model path);
- block-style arena attention: LLaDA-2.1-mini (32 rows, 16/4 heads x 128) and QwenDLM-4B
  (256 rows, 32/8 x 128) at contexts 1k / 4k / 16k: split-KV (picked by shape) vs the one-pass
  kernel (`splits=1`) vs SDPA (the twin).
- DiffusionGemma's vocabulary pass (256 rows x 262,144, from the LM head's bf16 output):
  `canvas_vocab` kernel vs its twin (the former torch code: softcap, softmax, cumsum +
  searchsorted, argmax, entropy, the soft embedding's softmax);
- the MoE plan (grouping DiffusionGemma's 256 x 8 = 2,048 (row, expert) pairs over 128 experts;
  LLaDA-2.1-mini's 32 x 8 over 256): the chunked multi-program plan vs the single program vs the
  torch sort plan.
Reports ms per call, the split count picked, the max |kernel - twin| and the byte floor
(K and V of the visible keys read once at the device's copy bandwidth (`common.PEAK_BYTES`)). The twin of the canvas attention builds its
masks per call (the old model path built them once per pass), a few microseconds more.
"""

from __future__ import annotations

import torch

from benchmarks.common import (
    PEAK_BYTES,
    block_attention_shape,
    canvas_attention_shape,
    cuda_time,
    iters_parser,
    write_result,
)
from dlmrt import capture_guard
from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini, qwen_dlm_4b
from dlmrt.models.diffusion_gemma_config import FULL, SLIDING
from dlmrt.ops import canvas, reference

ARENA = 20_480
DG = diffusion_gemma_26b()
CONTEXTS = (1024, 4096, 16384)


def _graph_ms(fn, iters: int) -> tuple[float, torch.Tensor]:
    fn()  # autotune / warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        out = fn()
    return cuda_time(graph.replay, iters) * 1e3, out


def _tensors(heads: int, kv_heads: int, dim: int, rows: int, gen) -> tuple[torch.Tensor, ...]:
    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.bfloat16)

    return rand(heads, rows, dim), rand(kv_heads, ARENA, dim), rand(kv_heads, ARENA, dim)


def canvas_case(kind: str, context: int, iters: int) -> dict:
    from dlmrt._kernels.canvas_attention import canvas_attention

    heads, kv_heads, dim, window = canvas_attention_shape(
        DG, SLIDING if kind == "sliding" else FULL
    )
    q, k, v = _tensors(heads, kv_heads, dim, 256, torch.Generator("cuda").manual_seed(context))
    pos = torch.arange(context, context + 256, device="cuda")
    new_ms, new = _graph_ms(lambda: canvas_attention(q, k, v, pos, True, window, 1.0), iters)
    old_ms, old = _graph_ms(lambda: canvas.canvas_attention(q, k, v, pos, True, window, 1.0), iters)
    keys = min(context, window - 1) + 256 if window else context + 256
    floor = 2 * kv_heads * keys * dim * 2 / PEAK_BYTES * 1e3
    return {
        "case": f"dg_canvas_{kind}", "context": context, "kernel_ms": round(new_ms, 4),
        "twin_sdpa_ms": round(old_ms, 4), "speedup": round(old_ms / new_ms, 2),
        "floor_ms": round(floor, 4), "max_abs_diff": float((new.float() - old.float()).abs().max()),
    }  # fmt: skip


def arena_case(name: str, rows: int, heads: int, kv_heads: int, context: int, iters: int) -> dict:
    from dlmrt._kernels.arena_attention import arena_attention
    from dlmrt._kernels.arena_attention_split import pick_splits
    from dlmrt._kernels.device import sm_count

    q, k, v = _tensors(heads, kv_heads, 128, rows, torch.Generator("cuda").manual_seed(rows))
    pos = torch.arange(context, context + rows, device="cuda")
    splits = pick_splits(rows, heads, ARENA, sm_count(q.device))
    split_ms, split = _graph_ms(lambda: arena_attention(q, k, v, pos, rows, 0.088), iters)
    one_ms, one = _graph_ms(lambda: arena_attention(q, k, v, pos, rows, 0.088, splits=1), iters)
    sdpa_ms, _ = _graph_ms(lambda: reference.arena_attention(q, k, v, pos, rows, 0.088), iters)
    floor = 2 * kv_heads * (context + rows) * 128 * 2 / PEAK_BYTES * 1e3
    return {
        "case": name, "rows": rows, "context": context, "splits": splits,
        "split_ms": round(split_ms, 4), "one_pass_ms": round(one_ms, 4),
        "sdpa_ms": round(sdpa_ms, 4), "floor_ms": round(floor, 4),
        "max_abs_diff_split_vs_one_pass": float((split.float() - one.float()).abs().max()),
    }  # fmt: skip


def plan_case(name: str, rows: int, experts: int, iters: int) -> dict:
    from dlmrt._kernels import moe_mlp, moe_plan

    gen = torch.Generator("cuda").manual_seed(rows)
    index = torch.stack(
        [torch.randperm(experts, device="cuda", generator=gen)[:8] for _ in range(rows)]
    )
    out = {"case": f"moe_plan_{name}", "pairs": rows * 8}
    plans = {"single_program": moe_plan.plan_small, "chunked": moe_plan.plan_chunked}
    for key, fn in plans.items():
        out[f"{key}_ms"] = round(_graph_ms(lambda fn=fn: fn(index, experts, 16), iters)[0], 4)
    saved = moe_mlp.MAX_PAIRS, moe_mlp.chunked_fits
    moe_mlp.MAX_PAIRS, moe_mlp.chunked_fits = 0, lambda *args: False
    try:
        out["torch_sort_ms"] = round(_graph_ms(lambda: moe_mlp.plan(index, experts), iters)[0], 4)
    finally:
        moe_mlp.MAX_PAIRS, moe_mlp.chunked_fits = saved
    return out


def vocab_case(iters: int) -> dict:
    from dlmrt._kernels.canvas_vocab import canvas_vocab

    from dlmrt.ops import vocab

    gen = torch.Generator("cuda").manual_seed(0)
    raw = (3 * torch.randn(256, 262_144, device="cuda", generator=gen)).to(torch.bfloat16)
    t, u = torch.tensor(0.8, device="cuda"), torch.rand(256, device="cuda", generator=gen)
    sc = torch.empty(256, 262_144, device="cuda", dtype=torch.bfloat16)
    new_ms, new = _graph_ms(lambda: canvas_vocab(raw, 30.0, t, u, sc), iters)
    old_ms, old = _graph_ms(lambda: vocab.canvas_vocab(raw, 30.0, t, u, sc), iters)
    floor = (raw.numel() * 2 * 2 + sc.numel() * 2) / PEAK_BYTES * 1e3  # two reads, one write
    return {
        "case": "dg_vocab_pass", "kernel_ms": round(new_ms, 4), "twin_ms": round(old_ms, 4),
        "speedup": round(old_ms / new_ms, 2), "floor_ms": round(floor, 4),
        "argmax_equal": bool(torch.equal(new[0], old[0])),
        "samples_equal": float((new[2] == old[2]).float().mean()),
        "max_entropy_diff": float((new[1] - old[1]).abs().max()),
    }  # fmt: skip


def main() -> None:
    args = iters_parser(__doc__).parse_args()
    results = []
    for context in CONTEXTS:
        for kind in ("sliding", "full"):
            results.append(canvas_case(kind, context, args.iters))
            print(results[-1], flush=True)
        for name, cfg in (("llada_mini", llada21_mini()), ("qwen_dlm_4b", qwen_dlm_4b())):
            rows, heads, kv = block_attention_shape(cfg)
            results.append(arena_case(name, rows, heads, kv, context, args.iters))
            print(results[-1], flush=True)
    results.append(vocab_case(args.iters))
    print(results[-1], flush=True)
    ll = llada21_mini()
    for name, rows, experts in (
        ("dg_canvas", DG.canvas_length, DG.num_experts),
        ("llada_mini", ll.block_size, ll.num_experts),
    ):
        results.append(plan_case(name, rows, experts, args.iters))
        print(results[-1], flush=True)
    if args.out:
        write_result(args.out, {"arena": ARENA, "results": results}, args.git_revision)


if __name__ == "__main__":
    main()
