"""Plots of the ORL demo (issue 17): the accuracy-vs-TPF frontier of every model in a sweep file
(`benchmarks/orl/orl_demo.py`), and the reward / rollout-TPF curves of ORL runs (their `log.jsonl`),
with their residual-to-embedding ratio (`residual_ratio`) when the runs logged it.
`--compare BASE` also prints each model's TPF at equal accuracy against BASE's (a markdown table).

    python -m benchmarks.orl.orl_demo_plot --sweep benchmarks/results/orl_demo_h200_2026-12-01.json \
        --runs benchmarks/results/orl_demo_runs_h200_2026-12-01.json \
        --out docs/orl_demo_frontier.png --curves docs/orl_demo_training.png
    (or --log NAME=runs/chain-orl/log.jsonl, repeatable, for runs of your own)

Needs matplotlib (not a dependency of dlmrt: `pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MARKERS = {"entropy_budget": "o", "threshold": "s"}


def frontier(sweep: dict, out: Path) -> None:
    """Accuracy vs TPF: each model's knob settings as markers (circle: entropy_budget, square:
    threshold) and its frontier (the settings no other of its settings beats on both axes) as a
    line, so "more TPF at equal accuracy" reads as a line further right."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (name, model) in enumerate(sweep["models"].items()):
        pts, color = model["points"], f"C{i}"
        front = frontier_points(pts)
        ax.plot([t for _, t in front], [100 * a for a, _ in front], color=color, lw=2, label=name)
        for rule, marker in MARKERS.items():
            sel = [p for p in pts if p["rule"] == rule]
            ax.scatter(
                [p["tokens_per_forward"] for p in sel],
                [100 * p["accuracy"] for p in sel],
                marker=marker,
                color=color,
                s=28,
                zorder=3,
            )
    for rule, marker in MARKERS.items():  # the marker legend, colourless
        ax.scatter([], [], marker=marker, color="grey", label=rule)
    ax.set_xlabel("tokens per forward (TPF)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(f"{sweep['task']}, {sweep['problems']} held-out problems, {sweep['device']}")
    ax.legend(fontsize=8, loc="lower left", ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def frontier_points(points: list[dict]) -> list[tuple[float, float]]:
    """The (accuracy, TPF) points no other point beats on both axes, by accuracy descending."""
    pts = sorted({(p["accuracy"], p["tokens_per_forward"]) for p in points}, reverse=True)
    out: list[tuple[float, float]] = []
    for acc, tpf in pts:  # accuracy descending: keep a point only if it adds TPF
        if not out or tpf > out[-1][1]:
            out.append((acc, tpf))
    return out


def tpf_at_accuracy(points: list[dict], accuracy: float) -> float | None:
    """The TPF a model reaches at `accuracy` along its frontier, linear between the knob's points
    (the knobs are continuous); None above its best accuracy."""
    front = frontier_points(points)
    if accuracy > front[0][0]:
        return None
    for (a_hi, t_hi), (a_lo, t_lo) in zip(front, front[1:]):
        if a_lo <= accuracy <= a_hi:
            return t_hi + (t_lo - t_hi) * (a_hi - accuracy) / (a_hi - a_lo)
    return front[-1][1]  # below every frontier point: the fastest point is accurate enough


def compare(sweep: dict, base: str, levels: list[float]) -> str:
    """A markdown table: each model's TPF at each accuracy level, and its ratio to `base`'s."""
    models = sweep["models"]
    if base not in models:
        raise SystemExit(f"--compare: no model {base!r} in the sweep ({', '.join(models)})")
    rows = ["| accuracy | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
    for level in levels:
        ref = tpf_at_accuracy(models[base]["points"], level)
        cells = []
        for model in models.values():
            tpf = tpf_at_accuracy(model["points"], level)
            ratio = f" ({tpf / ref:.2f}x)" if tpf is not None and ref else ""
            cells.append("-" if tpf is None else f"{tpf:.2f}{ratio}")
        rows.append(f"| {100 * level:.0f}% | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _smooth(values: list[float], k: int = 10) -> list[float]:
    return [
        sum(values[max(0, i - k + 1) : i + 1]) / len(values[max(0, i - k + 1) : i + 1])
        for i in range(len(values))
    ]


def read_log(path: Path) -> list[dict]:
    """The step lines of an ORL run's log.jsonl."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "reward" in r]


def read_runs(path: Path) -> dict[str, list[dict]]:
    """The runs of a results file's `runs` table (`orl_demo_runs_*.json`, `orl_residual_runs_*`,
    `residual_levers_*`): columns + rows per run."""
    runs = json.loads(path.read_text())["runs"]
    return {name: [dict(zip(r["columns"], row)) for row in r["rows"]] for name, r in runs.items()}


def ratio_points(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, residual_ratio) of the steps that logged a positive ratio: runs older than the field
    have none, a step without verified rollouts logs None, and a log axis cannot show 0 (a fresh
    adapter's first step)."""
    return [(r["step"], r["residual_ratio"]) for r in rows if (r.get("residual_ratio") or 0) > 0]


def curves(runs: dict[str, list[dict]], out: Path) -> None:
    """Reward and rollout TPF per step (10-step means) and, when any run logged it, the
    residual-to-embedding RMS ratio per step (log scale; the paper's 0.91-1.08 shaded)."""
    import matplotlib.pyplot as plt

    ratios = {name: pts for name, rows in runs.items() if (pts := ratio_points(rows))}
    fig, axes = plt.subplots(1, 3 if ratios else 2, figsize=(15 if ratios else 10, 3.8))
    ax_r, ax_t = axes[:2]
    for name, rows in runs.items():
        steps = [r["step"] for r in rows]
        ax_r.plot(steps, _smooth([r["reward"] for r in rows]), label=name)
        ax_t.plot(steps, _smooth([r["rollout_tpf"] for r in rows]), label=name)
    ax_r.set(xlabel="ORL step", ylabel="reward (verified share, 10-step mean)")
    ax_t.set(xlabel="ORL step", ylabel="rollout TPF (10-step mean)")
    if ratios:
        ax_z = axes[2]
        ax_z.axhspan(0.91, 1.08, color="grey", alpha=0.2, label="paper, QwenDLM (0.91-1.08)")
        for name, pts in ratios.items():
            ax_z.plot([s for s, _ in pts], [v for _, v in pts], label=name)
        ax_z.set(xlabel="ORL step", ylabel="residual / embedding RMS", yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sweep", required=True, help="a benchmarks/orl/orl_demo.py result file")
    ap.add_argument("--log", action="append", default=[], help="NAME=log.jsonl of an ORL run")
    ap.add_argument(
        "--runs",
        action="append",
        default=[],
        help="a results file with a 'runs' table (orl_demo_runs_*.json; repeatable)",
    )
    ap.add_argument("--out", required=True, help="the frontier plot (PNG)")
    ap.add_argument("--curves", default=None, help="the training curves plot (PNG)")
    ap.add_argument(
        "--compare",
        default=None,
        metavar="BASE",
        help="print TPF at equal accuracy against model BASE of the sweep",
    )
    ap.add_argument(
        "--levels",
        type=float,
        nargs="*",
        default=[0.85, 0.8, 0.75, 0.7, 0.6, 0.5],
        help="the accuracy levels of --compare",
    )
    args = ap.parse_args()
    if args.compare:
        print(compare(json.loads(Path(args.sweep).read_text()), args.compare, args.levels))
    frontier(json.loads(Path(args.sweep).read_text()), Path(args.out))
    runs = {name: rows for path in args.runs for name, rows in read_runs(Path(path)).items()}
    for spec in args.log:
        name, _, path = spec.partition("=")
        runs[name] = read_log(Path(path))
    if args.curves and runs:
        curves(runs, Path(args.curves))


if __name__ == "__main__":
    main()
