"""Plot: the quality-throughput frontier of a sweep, accuracy vs clean tokens/s or clean tokens per
forward (`--plot-x tps|tpf`, matplotlib). The accuracy axis always spans 0-100% (a zoomed axis
would make a few problems' difference look like precision) and labels stay inside the frame."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from dlmrt.bench import MissingDependency

X_AXES = {  # --plot-x: (summary field, axis label)
    "tps": ("clean_tokens_per_s", "clean tokens/s (single request)"),
    "tpf": ("clean_tpf", "clean tokens per forward (TPF)"),
}


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingDependency(
            "--plot needs matplotlib: pip install 'dlmrt[bench]' (or pip install matplotlib)"
        )


def frontier_points(report: dict[str, Any], x: str = "tps") -> list[tuple[float, float, str]]:
    """(x value, accuracy, label) per run in sweep order, x = clean tokens/s ("tps") or clean TPF
    ("tpf"); a run with no clean request (no x value) has no point."""
    if x not in X_AXES:
        raise ValueError(f"--plot-x: must be one of {', '.join(X_AXES)}, got {x!r}")
    key = X_AXES[x][0]
    return [
        (run["summary"][key], run["summary"]["accuracy"], run["label"])
        for run in report["runs"]
        if run["summary"].get(key) is not None
    ]


def frontier_figure(report: dict[str, Any], x: str = "tps") -> Any:
    """The matplotlib figure: one point per run (labelled with its sweep value), in sweep order."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    points = frontier_points(report, x)
    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=120)
    if points:
        xs, ys, _ = zip(*points)
        ax.plot(xs, [100 * y for y in ys], "o-", color="tab:blue", clip_on=False, zorder=3)
        _x_range(ax, xs)
        for px, py, label in points:
            _label(ax, px, 100 * py, label)
    else:
        ax.text(0.5, 0.5, "no clean requests", ha="center", transform=ax.transAxes)
    ax.set_ylim(0, 100)
    ax.yaxis.set_major_formatter(PercentFormatter(100))
    ax.set_xlabel(X_AXES[x][1])
    ax.set_ylabel("accuracy")
    knob = (report.get("sweep") or {}).get("knob")
    title = f"{Path(str(report['model'])).name} on {Path(str(report['dataset'])).name}"
    ax.set_title(title + (f" (sweep {knob})" if knob else ""), fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _x_range(ax: Any, xs: tuple[float, ...]) -> None:
    lo, hi = min(xs), max(xs)
    pad = (hi - lo) * 0.08 or max(abs(hi) * 0.1, 0.5)
    ax.set_xlim(max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad)


def _label(ax: Any, x: float, y: float, label: str) -> None:
    """A point's label, on the side of the point that faces the middle of the frame."""
    lo, hi = ax.get_xlim()
    right = x > (lo + hi) / 2
    top = y > 50
    ax.annotate(
        label,
        (x, y),
        textcoords="offset points",
        xytext=(-5 if right else 5, -6 if top else 6),
        ha="right" if right else "left",
        va="top" if top else "bottom",
        fontsize=8,
    )


def plot_frontier(report: dict[str, Any], path: str | Path, x: str = "tps") -> None:
    """Write the frontier figure to `path` (PNG, PDF, SVG: by its suffix)."""
    fig = frontier_figure(report, x)
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
