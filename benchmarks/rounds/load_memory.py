"""Peak GPU memory of bringing up each family's full-size model in bf16, FP8 and NVFP4.

    python -m benchmarks.rounds.load_memory [--models qwen_dlm llada2 diffusion_gemma]
        [--out results/load_memory_h200_DATE.json]

Each case starts from an empty GPU: the bf16 model allocated and filled (seeded random weights,
as `round_latency.py` builds it: what streaming a checkpoint into its allocated parameters
holds), then for FP8 every candidate quantized per channel and installed (`quantize_candidates`
+ `install`, the loader's own FP8 steps: codes kept in host memory until installed, each bf16
weight freed as its codes arrive), for NVFP4 the experts and dense MLPs quantized to NVFP4 in host
memory (as a checkpoint's reader holds them) and installed. Reports the peak of
`torch.cuda.max_memory_allocated` and what stays allocated after. Nothing is run through the
model: the peaks are the bring-up's, and the FP8 start-up measurements' scratch is in them.
"""

from __future__ import annotations

import argparse
import gc

import torch

from benchmarks import fp8_model
from benchmarks.common import write_result
from benchmarks.rounds.round_latency import build


def one(name: str, fmt: str) -> dict:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build(name, None)[0]
    after_bf16 = torch.cuda.memory_allocated()
    if fmt == "fp8":
        fp8_model.quantize(model)
    elif fmt == "nvfp4":
        fp8_model.quantize_nvfp4(model)
    torch.cuda.synchronize()
    out = {
        "model": name,
        "format": fmt,
        "bf16_model_gb": after_bf16 / 1e9,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
        "allocated_after_gb": torch.cuda.memory_allocated() / 1e9,
    }
    del model
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["qwen_dlm", "llada2", "diffusion_gemma"])
    ap.add_argument("--formats", nargs="+", default=["bf16", "fp8", "nvfp4"])
    ap.add_argument("--out", default="benchmarks/results/load_memory.json")
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args()
    results = []
    for name in args.models:
        for fmt in args.formats:
            r = one(name, fmt)
            results.append(r)
            print(r, flush=True)
    write_result(args.out, {"benchmark": "load_memory", "results": results}, args.git_revision)


if __name__ == "__main__":
    main()
