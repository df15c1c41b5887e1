"""`dlmrt bench` checks its flags before the model loads (output paths, --timeout,
--prompt-template), warns once about gold answers with no number, and draws an honest frontier
plot (accuracy on 0-100%, labels inside the frame, tokens/s or TPF on x)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

import dlmrt.llm
from dlmrt.bench.datasets import load_problems
from dlmrt.cli import main


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model fails the test: every check here must come before it."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(dlmrt.llm, "LLM", load)


def _bench(data: Path, *extra: str) -> int:
    return main(["bench", "--dataset", str(data), "--no-progress", *extra])


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "dlmrt: error: " in err
    return err


def test_out_is_a_directory(data, tmp_path, no_model, capsys):
    assert _bench(data, "--out", str(tmp_path)) == 2
    assert f"--out: {tmp_path} is a directory" in _error(capsys)


def test_plot_under_a_file(data, tmp_path, no_model, capsys):
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    assert _bench(data, "--plot", str(blocker / "sub" / "f.png")) == 2
    assert f"--plot: {blocker / 'sub' / 'f.png'}: {blocker} is not a directory" in _error(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_out_in_a_read_only_dir(data, tmp_path, no_model, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    assert _bench(data, "--out", str(ro / "new" / "r.json")) == 2
    assert f"cannot write in {ro}" in _error(capsys)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_timeout_must_be_positive(data, value, no_model, capsys):
    assert _bench(data, "--timeout", value) == 2
    assert "--timeout: must be a number of seconds > 0, got " in _error(capsys)


def test_prompt_template_needs_prompt(data, no_model, capsys):
    assert _bench(data, "--prompt-template", "Question: {question}") == 2
    assert "--prompt-template: 'Question: {question}' has no '{prompt}'" in _error(capsys)


def test_gold_answer_without_number_warns_once(tmp_path, caplog):
    path = tmp_path / "d.jsonl"
    answers = ["#### 4", "#### ", "four", "#### 1,000", "x\n#### n/a"]
    rows = [{"question": f"q{i}", "answer": a} for i, a in enumerate(answers)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="dlmrt"):
        assert len(load_problems(str(path))) == 5
    warnings = [r.getMessage() for r in caplog.records if "gold answers" in r.getMessage()]
    assert len(warnings) == 1
    assert "3 of 5 gold answers hold no number" in warnings[0]
    assert warnings[0].endswith(f"{path}:2, {path}:3, {path}:5")


def _report(points: list[tuple[str, float, float | None, float | None]]) -> dict:
    runs = [
        {"label": label, "summary": {"accuracy": acc, "clean_tokens_per_s": tps, "clean_tpf": tpf}}
        for label, acc, tps, tpf in points
    ]
    return {"model": "m", "dataset": "d.jsonl", "sweep": {"knob": "threshold"}, "runs": runs}


EDGES = [
    ("threshold=0.95 (slowest)", 1.0, 10.0, 1.1),
    ("threshold=0.9", 0.98, 11.0, 1.3),
    ("threshold=0.1 (fastest)", 0.0, 400.0, 6.0),
    ("none", 0.5, None, None),
]


@pytest.mark.parametrize("x", ["tps", "tpf"])
def test_frontier_labels_inside_the_frame(x):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from dlmrt.bench.plot import frontier_figure

    fig = frontier_figure(_report(EDGES), x)
    fig.canvas.draw()
    ax = fig.axes[0]
    frame = ax.get_window_extent()
    labels = [t for t in ax.texts if t.get_text().startswith("threshold")]
    assert len(labels) == 3
    for text in labels:
        box = text.get_window_extent()
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, text.get_text()
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1, text.get_text()
    plt.close(fig)


def test_frontier_accuracy_axis_is_0_to_100():
    """Accuracies of 97-99% are not stretched over the whole axis."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from dlmrt.bench.plot import frontier_figure

    fig = frontier_figure(_report([("a", 0.97, 50.0, 2.0), ("b", 0.99, 40.0, 1.5)]))
    assert fig.axes[0].get_ylim() == (0.0, 100.0)
    plt.close(fig)


def test_frontier_plots_tpf(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from dlmrt.bench.plot import frontier_figure, frontier_points, plot_frontier

    report = _report(EDGES)
    assert [p[0] for p in frontier_points(report, "tpf")] == [1.1, 1.3, 6.0]
    fig = frontier_figure(report, "tpf")
    assert "TPF" in fig.axes[0].get_xlabel()
    assert list(fig.axes[0].lines[0].get_xdata()) == [1.1, 1.3, 6.0]
    plt.close(fig)
    png = tmp_path / "f.png"
    plot_frontier(report, png, "tpf")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_x_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--plot-x {tps,tpf}" in out and "clean tokens per forward (tpf)" in out
