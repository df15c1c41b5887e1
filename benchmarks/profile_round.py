"""Profile one eager denoising round at a full model shape: top CUDA kernels by total time.

python benchmarks/profile_round.py [--model qwen_dlm|llada2] [--context 1024] [--rows 25] [--canvas masks|random]
"""

from __future__ import annotations

import argparse

import torch
from round_latency import _block, build
from torch.profiler import ProfilerActivity, profile

from dlmrt.engine.round import RoundSpec, denoise_round


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", choices=["qwen_dlm", "llada2"], default="qwen_dlm")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--canvas", choices=["masks", "random"], default="masks")
    args = ap.parse_args()
    model, rule, _, _ = build(args.model, None)
    if args.model == "qwen_dlm":  # the profiled QwenDLM round runs its ORL rule
        from dlmrt.decoding import make_rule

        rule = make_rule("entropy_budget")
    spec = RoundSpec(model, rule, 0.0, model.cfg.block_size)
    with torch.inference_mode():
        _, _, buf, kv, start = _block(model, "eager", args.context, rule, args.canvas)
        start()
        for _ in range(3):
            denoise_round(spec, buf, kv)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            denoise_round(spec, buf, kv)
            torch.cuda.synchronize()
    print(
        prof.key_averages().table(
            sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70
        )
    )


if __name__ == "__main__":
    main()
