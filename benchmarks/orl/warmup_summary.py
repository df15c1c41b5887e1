"""The residual warm-ups' verdict (issue 39's gate) and the one ORL starts from.

    python -m benchmarks.orl.warmup_summary OUT [--revision REV]

Reads what `residual_pipeline.sh warmup` left in OUT for each warm-up TAG: `warm-TAG.log.jsonl`
(the trainer's log), `warm-TAG.config.json` (its settings) and `warm-TAG-{on,off}.json` (`dlmrt
train eval` with the adapter on / off). Writes OUT/warmups.json: per warm-up the final residual
ratio, CE of the last pass with and without z, accuracy and TPF with the adapter on and off, and
whether it passes the gate (ratio 0.3-1.1 and the adapter-off ablation costs >= 2 points or >= 10%
TPF). Prints the directory of the chosen warm-up: among those passing, the ratio nearest the
paper's 0.91; else the ratio nearest 0.91 in log space, so the next stage still runs (the summary
says the gate was missed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from benchmarks.common import write_result

PAPER_RATIO = 0.91  # the paper's QwenDLM at the start of ORL (Figure 19)
RATIO_GATE = (0.3, 1.1)
POINTS_GATE, TPF_GATE = 0.02, 0.10


def summarize(out: Path, tag: str) -> dict:
    """One warm-up's settings, last log line and its two evaluations."""
    cfg = json.loads((out / f"warm-{tag}.config.json").read_text())
    last = json.loads((out / f"warm-{tag}.log.jsonl").read_text().splitlines()[-1])
    on = json.loads((out / f"warm-{tag}-on.json").read_text())
    off = json.loads((out / f"warm-{tag}-off.json").read_text())
    cost_points = on["accuracy"] - off["accuracy"]
    cost_tpf = on["tokens_per_forward"] / off["tokens_per_forward"] - 1
    ratio = last["residual_ratio"]
    return {
        "tag": tag,
        "adapter_lr": cfg["adapter_lr"],
        "adapter_adam_eps": cfg["adapter_adam_eps"],
        "steps": last["step"] + 1,
        "residual_ratio": ratio,
        "ce2": last["ce2"],
        "ce2_without_z": last["ce2_without_z"],
        "on": {k: on[k] for k in ("accuracy", "tokens_per_forward")},
        "off": {k: off[k] for k in ("accuracy", "tokens_per_forward")},
        "ablation_cost_points": round(100 * cost_points, 2),
        "ablation_cost_tpf": round(cost_tpf, 4),
        "passes_gate": RATIO_GATE[0] <= ratio <= RATIO_GATE[1]
        and (cost_points >= POINTS_GATE or cost_tpf >= TPF_GATE),
    }


def choose(rows: list[dict]) -> dict:
    """The warm-up ORL starts from (see the module docstring)."""
    passing = [r for r in rows if r["passes_gate"]] or rows
    return min(passing, key=lambda r: abs(math.log(max(r["residual_ratio"], 1e-12) / PAPER_RATIO)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--revision", default=None)
    args = ap.parse_args()
    tags = sorted(
        p.name[len("warm-") : -len("-off.json")] for p in args.out.glob("warm-*-off.json")
    )
    if not tags:
        sys.exit(f"{args.out}: no warm-*-off.json (run residual_pipeline.sh warmup first)")
    rows = sorted((summarize(args.out, t) for t in tags), key=lambda r: (r["adapter_lr"], r["tag"]))
    chosen = choose(rows)
    payload = {"warmups": rows, "chosen": chosen["tag"]}
    write_result(str(args.out / "warmups.json"), payload, args.revision)
    print(args.out / f"warm-{chosen['tag']}")


if __name__ == "__main__":
    main()
