"""The ORL demo's sweep (`benchmarks/orl/orl_demo.py`) and plots on the CPU, on the embedded demo model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_modules import BENCH, benchmark

from dlmrt import LLM
from dlmrt.tasks import get_task
from dlmrt.train.evaluate import evaluate

ROOT = BENCH.parent


def test_grid_orders_the_points_and_the_sweep_matches_evaluate():
    demo = benchmark("orl.orl_demo")
    points = demo.grid([0.4], [0.9, 0.5])
    assert points == [
        {"rule": "entropy_budget", "entropy_budget": 0.4},
        {"rule": "threshold", "threshold": 0.9},
        {"rule": "threshold", "threshold": 0.5},
    ]
    llm, task = LLM(device="cpu"), get_task("arithmetic")
    rows = demo.sweep(llm, task, 3, points[1:2], max_new_tokens=64)
    want = evaluate(llm, task, 3, max_new_tokens=64, **points[1])
    for key in ("accuracy", "tokens_per_forward", "generated_tokens", "denoising_forwards"):
        assert rows[0][key] == want[key], key  # the same problems, the same greedy tokens
    assert rows[0]["tokens_per_s"] > 0


def test_cli_writes_every_model_and_point_and_names_a_bad_model(tmp_path: Path):
    out = tmp_path / "sweep.json"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.orl.orl_demo",
        "--model",
        "a=dlmrt/assets/demo",
        "--model",
        "b=dlmrt/assets/demo",
        "--task",
        "arithmetic",
        "--problems",
        "2",
        "--gammas",
        "0.8",
        "--taus",
        "0.9",
        "--device",
        "cpu",
        "--max-new-tokens",
        "48",
        "--out",
        str(out),
    ]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert list(data["models"]) == ["a", "b"] and data["problems"] == 2
    for model in data["models"].values():
        assert [p["rule"] for p in model["points"]] == ["entropy_budget", "threshold"]
    assert data["models"]["a"]["points"] == [
        {**p, "seconds": q["seconds"], "tokens_per_s": q["tokens_per_s"]}
        for p, q in zip(data["models"]["b"]["points"], data["models"]["a"]["points"])
    ]  # the same model twice: the same accuracy and TPF at every point
    bad = subprocess.run(
        cmd[:3] + ["--model", "nodir", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "NAME=DIR" in bad.stderr


def test_plots_are_written(tmp_path: Path):
    pytest.importorskip("matplotlib")
    plot = benchmark("orl.orl_demo_plot")
    results = ROOT / "benchmarks" / "results"
    sweep = json.loads((results / "orl_demo_h200_2026-12-01.json").read_text())
    runs = plot.read_runs(results / "orl_demo_runs_h200_2026-12-01.json")
    assert set(runs) == {"orl", "no_aec", "refresh25"} and len(runs["orl"]) == 277
    plot.frontier(sweep, tmp_path / "f.png")
    plot.curves(runs, tmp_path / "c.png")
    assert (tmp_path / "f.png").stat().st_size > 0 and (tmp_path / "c.png").stat().st_size > 0


def test_the_curves_show_the_residual_ratio_when_a_run_logged_it(tmp_path: Path, monkeypatch):
    plot = benchmark("orl.orl_demo_plot")
    rows = [
        {"step": 1, "reward": 0.5, "rollout_tpf": 3.0, "residual_ratio": 0.0},
        {"step": 2, "reward": 0.5, "rollout_tpf": 3.1, "residual_ratio": None},
        {"step": 3, "reward": 0.6, "rollout_tpf": 3.2, "residual_ratio": 2e-5},
    ]
    assert plot.ratio_points(rows) == [(3, 2e-5)]  # no 0 on a log axis, no step without rows
    assert plot.ratio_points([{"step": 1, "reward": 0.5, "rollout_tpf": 3.0}]) == []
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    drawn, real = [], plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **kw: drawn.append(a) or real(*a, **kw))
    old = [{k: r[k] for k in ("step", "reward", "rollout_tpf")} for r in rows]
    plot.curves({"new": rows, "old": old}, tmp_path / "c.png")
    plot.curves({"old": old}, tmp_path / "d.png")
    assert drawn == [(1, 3), (1, 2)]  # the ratio panel only when a run has ratios
    assert (tmp_path / "c.png").stat().st_size > 0


def test_tpf_at_equal_accuracy_follows_the_frontier():
    """Dominated points are dropped, TPF is interpolated between frontier points, None above the
    best accuracy, and the comparison table divides by the base model's TPF."""
    plot = benchmark("orl.orl_demo_plot")
    pts = [
        {"accuracy": a, "tokens_per_forward": t}
        for a, t in [(0.9, 3.0), (0.8, 5.0), (0.85, 2.0), (0.6, 7.0), (0.6, 6.0)]
    ]
    assert plot.frontier_points(pts) == [(0.9, 3.0), (0.8, 5.0), (0.6, 7.0)]
    assert plot.tpf_at_accuracy(pts, 0.85) == pytest.approx(4.0)
    assert plot.tpf_at_accuracy(pts, 0.7) == pytest.approx(6.0)
    assert plot.tpf_at_accuracy(pts, 0.5) == 7.0 and plot.tpf_at_accuracy(pts, 0.95) is None
    faster = [{**p, "tokens_per_forward": 2 * p["tokens_per_forward"]} for p in pts]
    sweep = {"models": {"base": {"points": pts}, "orl": {"points": faster}}}
    table = plot.compare(sweep, "base", [0.85, 0.95])
    assert "| 85% | 4.00 (1.00x) | 8.00 (2.00x) |" in table and "| 95% | - | - |" in table
    with pytest.raises(SystemExit, match="no model 'x'"):
        plot.compare(sweep, "x", [0.8])
