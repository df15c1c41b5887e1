"""The current round / step times: the latest shipped-configuration run per (model, context,
weights, KV arena), as the markdown table docs/numbers.md shows.

    python -m benchmarks.numbers_table [--results benchmarks/results] [--write docs/numbers.md]

Reads every `round_latency_*.json` (block_graph rows only), leaves out the experiment files whose
names say so (`EXPERIMENTS`: split-KV at 256 rows, FlashAttention-4 on / auto, LLaDA's all-mask
canvas, the MoE plan A/B, the FP8 MLP with its fused GLU pinned off, a restructuring's before / after runs; FP8 / NVFP4 runs are rows of their own) and keeps the newest run of each
configuration (and GPU: the floors are the GPU's own, `common.PEAK_BYTES`) by the date it was written. The floor of an FP8 or NVFP4 row is the file's
`fp8_floor_ms` (round_latency.py writes the format's own floor there: FP8 weights at 1 byte,
NVFP4 experts at 0.5625). `--write` replaces the
table between the `numbers-table` markers of that file; `tests/test_numbers_table.py` checks that
docs/numbers.md holds exactly what this prints.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

BEGIN, END = "<!-- numbers-table: begin -->", "<!-- numbers-table: end -->"
# runs that are not the shipped configuration (an experiment's file name says so)
EXPERIMENTS = (
    "split256",
    "split_on",
    "split_off",
    "fa4on",
    "fa4auto",
    "_masks_",
    "_plan_",
    "glu_off",
    "restructure_",
    "streams_off",
    "_route",
)
NAMES = {
    "qwen_dlm": "QwenDLM-4B + ORL adapter, 256-row round",
    "llada2": "LLaDA-2.1-mini, 32-row round (random canvas)",
    "diffusion_gemma": "DiffusionGemma-26B-A4B, 256-row canvas step",
}
ORDER = {"qwen_dlm": 0, "llada2": 1, "diffusion_gemma": 2}
WEIGHTS = {"bf16": 0, "fp8": 1, "nvfp4": 2}


def runs(results: str) -> dict[tuple, dict]:
    """(model, context, weights, kv, GPU) -> the newest block_graph run of it."""
    latest: dict[tuple, dict] = {}
    for path in sorted(glob.glob(os.path.join(results, "round_latency_*.json"))):
        name = os.path.basename(path)
        data = json.load(open(path))
        if "results" not in data or "model" not in data or any(e in name for e in EXPERIMENTS):
            continue
        dtype = data.get("shape", {}).get("dtype") or {}
        dtype = dtype if isinstance(dtype, dict) else {}
        weights, kv = (
            requested(data.get("command", "")) or dtype.get("weights", "bf16"),
            dtype.get("kv_cache", "auto"),
        )
        for r in data["results"]:
            if r["mode"] != "block_graph":
                continue
            key = (data["model"], r["context"], weights, kv, gpu(data.get("device", "")))
            run = {"date": data["date"], "revision": data["git_revision"], "file": name, **r}
            if key not in latest or run["date"] > latest[key]["date"]:
                latest[key] = run
    return latest


def gpu(device: str) -> str:
    """The GPU's short name in a device string ("NVIDIA H100 80GB HBM3" -> "H100")."""
    return next((g for g in ("H100", "H200") if g in device), device or "?")


def requested(command: str) -> str | None:
    """The weight format a run asked for (`--quantization`; none = bf16): a run whose NVFP4
    layers the start-up choice all dequantized still counts as the NVFP4 configuration."""
    words = command.replace("--quantization=", "--quantization ").split()
    if "--quantization" not in words[:-1]:
        return None
    fmt = words[words.index("--quantization") + 1]
    return "bf16" if fmt == "none" else fmt


def table(results: str) -> str:
    """The markdown table, one row per configuration, in a fixed order."""
    rows = [
        "| model, shape | context | weights | KV arena | GPU | ms | floor (ms) | x floor | revision, date | file |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    found = runs(results)
    order = sorted(
        found, key=lambda k: (ORDER.get(k[0], 9), k[1], WEIGHTS.get(k[2], 9), k[3], k[4])
    )
    for key in order:
        model, context, weights, kv, device = key
        r = found[key]
        floor = (
            r.get("fp8_floor_ms") if weights != "bf16" and r.get("fp8_floor_ms") else r["floor_ms"]
        )
        rows.append(
            f"| {NAMES.get(model, model)} | {context // 1024}k | {weights} | {'FP8' if kv == 'fp8' else 'bf16'} | {device} "
            f"| {r['ms_per_round']:.3f} | {floor:.2f} | {r['ms_per_round'] / floor:.2f} "
            f"| {r['revision'].split()[0]}, {r['date'][:10]} | `{r['file']}` |"
        )  # fmt: skip
    return "\n".join(rows)


def write(doc: str, results: str) -> None:
    """Replace the table between the markers of `doc`."""
    text = open(doc).read()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    open(doc, "w").write(f"{head}{BEGIN}\n{table(results)}\n{END}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--results", default=os.path.join(here, "results"))
    ap.add_argument("--write", default=None, help="a markdown file with the table's markers")
    args = ap.parse_args()
    if args.write:
        write(args.write, args.results)
    else:
        print(table(args.results))


if __name__ == "__main__":
    main()
