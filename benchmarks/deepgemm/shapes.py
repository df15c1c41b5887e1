"""DeepGEMM at every projection shape of QwenDLM-4B, LLaDA-2.1-mini and DiffusionGemma-26B-A4B:
its bf16 and FP8 GEMMs against cuBLAS bf16 and our FP8 path (dense.py), and its masked and
contiguous M-grouped GEMMs against our expert kernels (grouped.py), each result checked against
an fp32 reference; µs, floors, JSON to benchmarks/results/. Needs deep_gemm built
(benchmarks/deepgemm/README.md) on an SM90 GPU.

    . benchmarks/deepgemm/env.sh
    python -m benchmarks.deepgemm.shapes [--families qwen_dlm llada2 diffusion_gemma]
        [--rows 256 1 7] [--kinds bf16 fp8] [--layouts masked contiguous] [--no-experts]
        [--only qwen_dlm.o ...] [--jit-workers 8] [--ours measured|cublas|triton|none]
        [--touched N] [--out benchmarks/results/deepgemm_shapes_h100_DATE.json]

Rows: each family's block rows (QwenDLM and DiffusionGemma 256, LLaDA 32) and 1 / 7 as a
sanity pair, unless --rows. DeepGEMM compiles every new kernel with nvcc at first use (seconds
each): with --jit-workers N > 0 every case's DeepGEMM calls run first, once, spread over N
processes sharing DG_JIT_CACHE_DIR, so the timed process finds them compiled. The result file
is rewritten after every case, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import command_line, write_result
from benchmarks.deepgemm import dense, grouped
from benchmarks.deepgemm.cases import FAMILY_ROWS, dense_rows, dense_shapes, expert_shapes
from dlmrt.ops import choices, deepgemm


def tasks(args: argparse.Namespace) -> list[tuple]:
    """Every case of this run: ("dense", name, rows, kind) and ("experts", family, kind, layout)."""
    out: list[tuple] = []
    for shape in dense_shapes():
        if shape.family in args.families and (not args.only or shape.name in args.only):
            for rows in dense_rows(shape, args.rows):
                out += [("dense", shape.name, rows, kind) for kind in args.kinds]
    if args.experts:
        for family, _ in expert_shapes():
            if family in args.families:
                out += [("experts", family, k, lay) for k in args.kinds for lay in args.layouts]
    return out


def run_task(dg, task: tuple, touched: int | None, warm_only: bool, ours: bool = True) -> dict:
    """One case's row (`warm_only`: its DeepGEMM calls once, untimed)."""
    if task[0] == "dense":
        shape = next(s for s in dense_shapes() if s.name == task[1])
        return dense.run(dg, shape, task[2], task[3], warm_only, ours)
    family, shape = next((f, s) for f, s in expert_shapes() if f == task[1])
    return grouped.run(dg, family, shape, task[2], task[3], touched, warm_only)


def warm_shard(todo: list[tuple], shard: str, touched: int | None) -> None:
    """In a worker process (`--jit-shard I/N`): run the DeepGEMM calls of every N-th case from
    the I-th, once each, untimed (their kernels compile into DG_JIT_CACHE_DIR)."""
    i, n = (int(v) for v in shard.split("/"))
    dg = deepgemm.library()
    for task in todo[i::n]:
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                run_task(dg, task, touched, warm_only=True)
            torch.cuda.synchronize()
            err = ""
        except Exception as e:  # noqa: BLE001 (reported; the timed pass records it again)
            err = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        print(f"jit {task}: {time.perf_counter() - t0:.1f} s {err}", flush=True)


def warm_jit(workers: int) -> None:
    """Compile every case's kernels in `workers` processes, each this command with
    `--jit-shard I/N` (run as a module from the repository root, as this one: the package takes
    the root off the import path, so a spawned multiprocessing child could not import it).
    DG_JIT_CACHE_DIR is shared: DeepGEMM renames each finished kernel directory into place, so
    concurrent builds are safe (csrc/jit/compiler.hpp `Compiler::build`)."""
    t0 = time.perf_counter()
    root = Path(__file__).resolve().parents[2]
    base = [sys.executable, "-m", "benchmarks.deepgemm.shapes", *sys.argv[1:]]
    procs = [
        subprocess.Popen([*base, "--jit-shard", f"{i}/{workers}"], cwd=root) for i in range(workers)
    ]
    codes = [p.wait() for p in procs]
    print(f"jit warm-up: {workers} workers in {time.perf_counter() - t0:.0f} s, exit {codes}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--families", nargs="+", default=list(FAMILY_ROWS), choices=list(FAMILY_ROWS))
    ap.add_argument("--rows", type=int, nargs="+", help="default: the family's rows, 1 and 7")
    ap.add_argument("--kinds", nargs="+", default=list(dense.KINDS), choices=dense.KINDS)
    ap.add_argument("--layouts", nargs="+", default=list(grouped.LAYOUTS), choices=grouped.LAYOUTS)
    ap.add_argument("--no-experts", dest="experts", action="store_false")
    ap.add_argument("--only", nargs="+", help="dense shape names (e.g. qwen_dlm.o)")
    ap.add_argument("--touched", type=int, help="route over this many experts (default: all)")
    ap.add_argument("--jit-workers", type=int, default=8, help="0: compile in the timed process")
    ap.add_argument(
        "--ours",
        default="measured",
        choices=("measured", "cublas", "triton", "none"),
        help="our FP8 GEMM (DLMRT_FP8_GEMM_KERNEL); none: skip our FP8 path",
    )
    ap.add_argument("--out", default="benchmarks/results/deepgemm_shapes.json")
    ap.add_argument("--git-revision", default=None)
    ap.add_argument("--jit-shard", help=argparse.SUPPRESS)  # I/N: a warm-up worker (warm_jit)
    args = ap.parse_args()
    if args.ours != "none":
        os.environ["DLMRT_FP8_GEMM_KERNEL"] = args.ours
    dg = deepgemm.library()
    if dg is None:
        sys.exit(f"no DeepGEMM here: {choices.get(deepgemm.LIBRARY).line()}")
    todo = tasks(args)
    if args.jit_shard:
        return warm_shard(todo, args.jit_shard, args.touched)
    if args.jit_workers > 0:
        warm_jit(args.jit_workers)
    rows: list[dict] = []
    for task in todo:
        try:
            with torch.inference_mode():
                row = run_task(dg, task, args.touched, False, args.ours != "none")
        except Exception as e:  # noqa: BLE001 (a shape DeepGEMM refuses is a result too)
            row = {"task": list(task), "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
        rows.append(row)
        print(row, flush=True)
        payload = {"benchmark": "deepgemm_shapes", "command": command_line(), "results": rows}
        payload["deepgemm"] = {"version": deepgemm._version(dg), "stamp": _stamp()}
        write_result(args.out, payload, args.git_revision)


def _stamp() -> str:
    """The staged commits (.deepgemm-build/site/STAMP, written by build.sh), if there."""
    prefix = os.environ.get("DEEPGEMM_PREFIX", ".deepgemm-build")
    try:
        with open(os.path.join(prefix, "site", "STAMP")) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
