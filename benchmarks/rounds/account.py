"""A per-round account: every kernel of one eager round at a full model shape, its op and floor.

    python -m benchmarks.rounds.account --model qwen_dlm|llada2|diffusion_gemma
        [--quantization none|fp8] [--context 1024] [--canvas masks|random] [--layers N]
        [--out benchmarks/results/round_account_<model>[_fp8].json]

The round is `profile_round.py`'s (seeded random weights from `round_latency.build`; QwenDLM runs
its ORL rule; DiffusionGemma one canvas step), run eager once under torch.profiler with the op
labels on (`dlmrt/account.py`, `benchmarks/account/`). Prints the totals per op kind (summed over
layers) sorted by excess time (µs - floor), the round's total, and every kernel with its op, µs,
the op's floor (max(FLOPs / peak, bytes / the device's copy bandwidth)) and ratio; writes them as
JSON. Kernel µs are the profiler's (eager launches, one stream each; DiffusionGemma's experts run
on a second stream, so its kernel sum exceeds the step's wall span, both given).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.account import events, table
from benchmarks.account.take import take
from benchmarks.common import PEAK_BYTES, PEAK_FLOPS, command_line, write_result


def take_account(
    model: nn.Module,
    round_fn: Callable[[], None],
    warmup: int = 3,
    bandwidth: float = PEAK_BYTES,
    peak_flops: float = PEAK_FLOPS,
) -> dict:
    """{"total", "kinds", "kernels"} of one call of `round_fn` after `warmup` calls."""
    for _ in range(warmup):
        round_fn()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    records, evs = take(model, round_fn)
    kernels, cpu_spans, dev_spans = events.parse(evs)
    seqs = events.assign(kernels, cpu_spans, dev_spans)
    ops = table.build_ops(records, kernels, seqs, bandwidth, peak_flops)
    return {
        "total": table.total(ops),
        "kinds": table.kind_totals(ops),
        "kernels": table.kernel_rows(ops),
    }


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", choices=["qwen_dlm", "llada2", "diffusion_gemma"], default="qwen_dlm"
    )
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--canvas", choices=["masks", "random"], default="masks")
    ap.add_argument("--quantization", choices=["none", "fp8"], default="none")
    ap.add_argument("--layers", type=int, default=None, help="default: the model's own")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/round_account_...")
    ap.add_argument("--git-revision", default=None)
    return ap.parse_args()


def main() -> None:
    from benchmarks.rounds.profile_round import quantize_fp8, round_fn
    from benchmarks.rounds.round_latency import build

    args = _args()
    model, rule, _, shape = build(args.model, args.layers, args.canvas)
    if args.quantization == "fp8":
        quantize_fp8(model)
    result = take_account(model, round_fn(args.model, model, rule, args.context, args.canvas))
    print(table.markdown(result["kinds"], result["kernels"], result["total"]))
    fp8 = "_fp8" if args.quantization == "fp8" else ""
    out = args.out or f"benchmarks/results/round_account_{args.model}{fp8}.json"
    floors = {"copy_bandwidth": PEAK_BYTES, "peak_flops": PEAK_FLOPS}
    floors["fp8_peak_flops"] = 2 * PEAK_FLOPS
    payload = {"benchmark": "round_account", "model": args.model, "command": command_line()}
    payload |= {"shape": shape, "context": args.context, "canvas": args.canvas}
    payload |= {"quantization": args.quantization, "floors": floors, **result}
    write_result(out, payload, args.git_revision)


if __name__ == "__main__":
    main()
