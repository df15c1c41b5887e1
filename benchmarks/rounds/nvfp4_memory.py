"""DiffusionGemma-26B from an NVFP4 checkpoint: peak GPU memory and ms/step, prefer="memory" vs "speed".

    python -m benchmarks.rounds.nvfp4_memory [--layers 30] [--context 1024] [--prefer memory speed]
        [--mode block_graph] [--out benchmarks/results/nvfp4_memory.json]
    python -m benchmarks.rounds.nvfp4_memory --tiny --device cpu      # a smoke test (tiny widths)

Writes a random-weight NVFP4 checkpoint of the full-size model (`random_nvfp4_checkpoint.py`:
ModelOpt layout, one file per layer, about 16.5 GB at 30 layers) into a temporary directory
(`--tmp`; removed after), then for each `--prefer` from an empty GPU: `load_checkpoint` (bf16)
and one-canvas requests of 4 and `--steps` decoder steps (never stopping early; ms/step = their
difference over the extra steps, so no prompt encoding is in it), in `--mode`. Reports the peak
of `torch.cuda.max_memory_allocated` over the load and over the load + steps, what stays
allocated after the load, the load's seconds and how the experts and dense MLPs run.
prefer="memory" keeps the experts 4-bit on the W4A16 kernel; "speed" (the default) runs them
as their measured choice says (on Hopper: converted to FP8, W8A8). Both load without a bf16 copy
of the NVFP4 weights (`dlmrt/loading/deferred.py`). The issue's bound: memory <= 25 GB; speed
no higher than the FP8 path (`load_memory.py`: DiffusionGemma FP8 bring-up 52.68 GB on an H200).
On the CPU (the smoke test) the NVFP4 weights are dequantized at load (no kernels) and no
memory is reported.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from benchmarks.common import command_line, write_result
from benchmarks.random_nvfp4_checkpoint import write_random_nvfp4
from benchmarks.rounds.canvas_step import time_canvas_mode
from dlmrt.loading.checkpoint import load_checkpoint


def _gb(n: int) -> float:
    return round(n / 1e9, 2)


def _kinds(model) -> dict[str, int]:
    """How the experts and the dense MLPs run: implementation class -> layers."""
    kinds = Counter(f"experts {type(layer.experts.impl).__name__}" for layer in model.model.layers)
    kinds.update(
        f"dense mlp {type(getattr(layer.mlp, 'gate_up', None)).__name__}"
        for layer in model.model.layers
    )
    return dict(kinds)


def one(path: Path, prefer: str, device: torch.device, args) -> dict:
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0  # what an earlier case left: ~0
    dtype = torch.bfloat16 if cuda else torch.float32
    t0 = time.perf_counter()
    ckpt = load_checkpoint(path, dtype, device, prefer=prefer)
    if cuda:
        torch.cuda.synchronize()
    out: dict = {"prefer": prefer, "load_s": round(time.perf_counter() - t0, 1)}
    if cuda:
        out["allocated_before_gb"] = _gb(before)
        out["load_peak_gb"] = _gb(torch.cuda.max_memory_allocated())
        out["allocated_after_load_gb"] = _gb(torch.cuda.memory_allocated())
    out["runs"] = _kinds(ckpt.model)
    with torch.inference_mode():
        ms, _ = time_canvas_mode(ckpt.model, args.mode, args.context, args.iters, steps=args.steps)
        out["ms_per_step"] = round(ms, 3)
    if cuda:
        out["peak_gb"] = _gb(torch.cuda.max_memory_allocated())
    del ckpt
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12, help="the longer request's decoder steps")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--prefer", nargs="+", default=["memory", "speed"])
    ap.add_argument("--mode", default=None, help="execution mode (default block_graph; CPU eager)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny widths, 6 layers (a CPU smoke test)")
    ap.add_argument("--tmp", default=None, help="where the checkpoint is written (removed after)")
    ap.add_argument("--out", default="benchmarks/results/nvfp4_memory.json")
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    args.mode = args.mode or ("block_graph" if device.type == "cuda" else "eager")
    layers = 6 if args.tiny else args.layers
    if args.tiny:
        args.context = min(args.context, 64)
    results = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        t0 = time.perf_counter()
        path = write_random_nvfp4(Path(tmp) / "dg-nvfp4", layers, args.tiny)
        write_s = round(time.perf_counter() - t0, 1)
        size = sum(f.stat().st_size for f in path.iterdir())
        print(f"wrote {path} ({_gb(size)} GB) in {write_s} s", flush=True)
        for prefer in args.prefer:
            r = one(path, prefer, device, args)
            results.append(r)
            print(r, flush=True)
    payload = {
        "benchmark": "nvfp4_memory",
        "command": command_line(),
        "model": "DiffusionGemma-26B-A4B" + (" (tiny widths)" if args.tiny else ""),
        "layers": layers,
        "context": args.context,
        "mode": args.mode,
        "checkpoint_gb": _gb(size),
        "write_s": write_s,
        "results": results,
    }
    write_result(args.out, payload, args.git_revision)
    return payload


if __name__ == "__main__":
    main()
