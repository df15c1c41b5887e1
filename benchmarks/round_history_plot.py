"""Round latency over the project's history, per model, against the floor and issue 14's targets.

python -m benchmarks.round_history_plot [--out docs/round_history.png]

Reads every `benchmarks/results/round_latency_*.json` (written by `round_latency.py`), keeps the
shipped configuration's runs (bf16 weights, bf16 KV arena, block_graph; LLaDA-2.1-mini on the
random canvas; no optional FlashAttention-4) and leaves out the experiments named in the file
(`EXPERIMENTS`: split-KV at 256 rows, FlashAttention-4 on or auto, FP8 / NVFP4 weights, an FP8
arena, LLaDA's all-mask canvas). Runs are ordered by the time they were written. One panel per model
(QwenDLM at 1k and 4k context), each run's floor as a dotted line, the target as a dashed one.
Different machines of one kind differ by a few percent run to run (docs/numbers.md), so read the
trend, not single steps.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

EXPERIMENTS = ("split256", "split_on", "split_off", "fa4on", "fa4auto", "fp8", "nvfp4", "masks")
TARGETS_MS = {
    ("qwen_dlm", 1024): 5.0,
    ("qwen_dlm", 4096): 5.6,
    ("llada2", 1024): 4.0,
    ("diffusion_gemma", 1024): 16.0,
}  # fmt: skip  (issue 14, bf16)
TITLES = {
    ("qwen_dlm", 1024): "QwenDLM-4B, 256 rows, 1k context",
    ("qwen_dlm", 4096): "QwenDLM-4B, 256 rows, 4k context",
    ("llada2", 1024): "LLaDA-2.1-mini, 32 rows, 1k context",
    ("diffusion_gemma", 1024): "DiffusionGemma-26B-A4B step, 1k context",
}


def shipped_runs(results_dir: str) -> dict[tuple[str, int], list[dict]]:
    """(model, context) -> [{date, revision, ms, floor}] of the shipped configuration, in order."""
    runs: dict[tuple[str, int], list[dict]] = {key: [] for key in TARGETS_MS}
    files = sorted(glob.glob(os.path.join(results_dir, "round_latency_*.json")))
    for path in files:
        name = os.path.basename(path)
        if any(tag in name for tag in EXPERIMENTS):
            continue
        data = json.load(open(path))
        shape = data.get("shape") or {}
        dtype = shape.get("dtype", "bf16")
        weights = dtype.get("weights") if isinstance(dtype, dict) else dtype
        kv = dtype.get("kv_cache", "auto") if isinstance(dtype, dict) else "auto"
        model = data.get("model") or "qwen_dlm"  # the first runs (2026-11-29) named no model
        if "H100" in data.get("device", ""):  # the history is the H200's; one GPU per curve
            continue
        if weights != "bf16" or kv != "auto":
            continue
        if model == "llada2" and shape.get("canvas") != "random":
            continue
        for row in data.get("results", []):
            key = (model, row["context"])
            if row["mode"] == "block_graph" and key in runs:
                runs[key].append(
                    {
                        "date": data.get("date", ""),
                        "file": name,
                        "revision": str(data.get("git_revision", ""))[:7],
                        "ms": row["ms_per_round"],
                        "floor": row.get("floor_ms"),
                    }
                )
    for key in runs:
        runs[key].sort(key=lambda r: (r["date"], r["file"]))
    return runs


def plot(runs: dict[tuple[str, int], list[dict]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    for ax, key in zip(axes.flat, TARGETS_MS):
        points = runs[key]
        xs = range(len(points))
        ax.plot(xs, [p["ms"] for p in points], "o-", color="tab:blue", label="block_graph, bf16")
        floors = [p["floor"] for p in points]
        if any(f is not None for f in floors):
            ax.plot(xs, floors, ":", color="gray", label="floor (FLOPs or bytes)")
        ax.axhline(TARGETS_MS[key], ls="--", color="tab:red", label=f"target {TARGETS_MS[key]} ms")
        for x, p in zip(xs, points):
            ax.annotate(
                f"{p['ms']:.2f}",
                (x, p["ms"]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=7,
            )
        ax.set_xticks(list(xs), [f"{p['date'][5:10]}\n{p['revision']}" for p in points], fontsize=6)
        ax.set_title(TITLES[key], fontsize=10)
        ax.set_ylabel("ms per round")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Round latency on one H200 over the project's history (benchmarks/results)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--results", default=os.path.join(here, "results"))
    ap.add_argument("--out", default="docs/round_history.png")
    args = ap.parse_args()
    runs = shipped_runs(args.results)
    for key, points in runs.items():
        print(key, [(p["revision"], p["ms"]) for p in points])
    plot(runs, args.out)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
