"""Profile one eager denoising round of the QwenDLM-4B shape: top CUDA kernels by total time.

python benchmarks/profile_round.py [--context 1024] [--rows 25]
"""

from __future__ import annotations

import argparse

import torch
from common import qwen_dlm_4b, random_model
from torch.profiler import ProfilerActivity, profile

from dlmrt.decoding import make_rule
from dlmrt.engine.engine import Engine
from dlmrt.engine.round import RoundSpec, denoise_round


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=25)
    args = ap.parse_args()
    model = random_model(qwen_dlm_4b(), torch.device("cuda"))
    engine = Engine(model, torch.device("cuda"), torch.bfloat16, "eager")
    kv = engine._arena(args.context + 256)
    spec = RoundSpec(model, make_rule("entropy_budget"), 0.0, 256)
    with torch.inference_mode():
        engine._prefill(torch.randint(0, 150000, (args.context,)).tolist(), 256, kv)
        runner, buf = engine._runner(spec, None)
        buf.load(
            torch.full((256,), 151669, device="cuda"),
            torch.ones(256, dtype=torch.bool, device="cuda"),
            args.context,
            0,
        )
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
