"""Plot: the quality-throughput frontier of a sweep, accuracy vs clean tokens/s (matplotlib)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from dlmrt.bench import MissingDependency


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingDependency(
            "--plot needs matplotlib: pip install 'dlmrt[bench]' (or pip install matplotlib)"
        )


def frontier_points(report: dict[str, Any]) -> list[tuple[float, float, str]]:
    """(clean tokens/s, accuracy, label) per run in sweep order; a run with no clean request
    (no tokens/s) has no point."""
    return [
        (run["summary"]["clean_tokens_per_s"], run["summary"]["accuracy"], run["label"])
        for run in report["runs"]
        if run["summary"]["clean_tokens_per_s"] is not None
    ]


def plot_frontier(report: dict[str, Any], path: str | Path) -> None:
    """One point per run (labelled with its sweep value), joined in sweep order."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    points = frontier_points(report)
    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=120)
    if points:
        xs, ys, labels = zip(*points)
        ax.plot(xs, [100 * y for y in ys], "o-", color="tab:blue")
        for x, y, label in points:
            ax.annotate(label, (x, 100 * y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    else:
        ax.text(0.5, 0.5, "no clean requests", ha="center", transform=ax.transAxes)
    ax.set_xlabel("clean tokens/s (single request)")
    ax.set_ylabel("accuracy (%)")
    knob = (report.get("sweep") or {}).get("knob")
    title = f"{Path(str(report['model'])).name} on {Path(str(report['dataset'])).name}"
    ax.set_title(title + (f" (sweep {knob})" if knob else ""), fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
