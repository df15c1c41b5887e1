"""The `dlmrt` console script end to end (subprocess), plus cheap in-process error paths."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import residual_config, write_checkpoint

from dlmrt.cli import main
from dlmrt.config import EngineConfig
from dlmrt.params import DecodeParams

DLMRT = shutil.which("dlmrt")
STATS = re.compile(
    r"\[(\d+) tokens, finish=(stop|length), \d+ denoising \+ \d+ commit forwards, "
    r"TPF [\d.]+, [\d.]+ tokens/s, [\d.]+ ms/round, mode eager, \d+ ms\]"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("cli") / "orl", residual=residual_config())


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # One OpenMP thread: spin-waiting thread pools crawl on a busy 2-core CI box.
    return dict(os.environ, OMP_NUM_THREADS="1")


def _run(args: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    cmd = args if args[0] == sys.executable else [DLMRT, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, **kw)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_console_script_and_module_entry_point(env):
    """`dlmrt --help` (the console script) and `python -m dlmrt --help` list every subcommand."""
    assert DLMRT is not None
    for cmd in ([DLMRT, "--help"], [sys.executable, "-m", "dlmrt", "--help"]):
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        for sub in ("generate", "serve", "bench", "train"):
            assert sub in res.stdout


def test_generate_demo_default(env):
    """`dlmrt generate PROMPT` without --model answers with the embedded (trained) demo model."""
    res = _run(["generate", "What is 12+30?"], env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("The answer is 42.")
    assert "embedded demo model" in res.stderr  # says which model answered


def test_demo_answers_held_out_problems_through_the_cli(env):
    """The shipped demo model solves the first five held-out problems through `dlmrt generate`."""
    from dlmrt.tasks import get_task

    task = get_task("arithmetic")
    for problem in task.problems("test", 5):
        res = _run(["generate", problem.question], env)
        assert res.returncode == 0, res.stderr
        assert task.verify(res.stdout, problem.answer), (problem.question, res.stdout)


def test_generate_stats_and_progress(model_dir, env):
    """--stats prints the stats line and --progress one '[block i]' line per block to stderr."""
    args = ["generate", "--model", str(model_dir), "--rule", "entropy_budget"]
    args += ["--entropy-budget", "0.8", "--max-new-tokens", "20", "--ignore-eos"]
    res = _run([*args, "--stats", "--progress", "prompt"], env)
    assert res.returncode == 0, res.stderr
    m = STATS.search(res.stderr)
    assert m and m.group(1) == "20" and m.group(2) == "length"
    blocks = re.findall(r"^\[block (\d+)\] \d+ rounds, \d+ tokens so far$", res.stderr, re.M)
    assert blocks == ["0", "1", "2", "3"]  # 6 prompt + 20 new tokens span blocks 0..3 of 8
    assert res.stdout.endswith("\n")


def test_progress_numbers_generated_blocks_and_stdin_drops_the_newline(model_dir, env):
    """A prompt of two full blocks: --progress still numbers the generated blocks from 0; a
    stdin prompt loses the newline `echo` adds (same answer as the argument form)."""
    args = ["generate", "--model", str(model_dir), "--max-new-tokens", "12", "--ignore-eos"]
    res = _run([*args, "--progress", "x" * 17], env)
    assert res.returncode == 0, res.stderr
    blocks = re.findall(r"^\[block (\d+)\]", res.stderr, re.M)
    assert blocks == ["0", "1"]  # 17 + 12 tokens: absolute blocks 2 and 3 of 8
    piped = _run([*args, "-"], env, input="What is 3+4?\n")
    direct = _run([*args, "What is 3+4?"], env)
    assert piped.returncode == direct.returncode == 0 and piped.stdout == direct.stdout


def test_generate_help_lists_every_field(env):
    """--help shows a flag for every DecodeParams and EngineConfig field and describes the demo."""
    res = _run(["generate", "--help"], env)
    assert res.returncode == 0
    for cls in (DecodeParams, EngineConfig):
        for f in dataclasses.fields(cls):
            assert _flag(f.name) in res.stdout, f.name
    assert "embedded demo" in res.stdout and "arithmetic" in res.stdout
    fold = res.stdout[res.stdout.index("  --fold-commits, --no-fold-commits") :]
    assert "(default: on)" in fold.split("  --skip-weight-check")[0]  # folding is on by default


def test_bad_value_exits_cleanly(env):
    """--threshold 2 exits non-zero with an error naming threshold, without a traceback."""
    res = _run(["generate", "--threshold", "2", "x"], env)
    assert res.returncode != 0
    assert "threshold" in res.stderr and "Traceback" not in res.stderr
    assert not res.stdout


def test_missing_model_dir(env, tmp_path):
    """A missing --model directory exits non-zero with an error naming the path."""
    missing = tmp_path / "no" / "such-model"
    res = _run(["generate", "--model", str(missing), "x"], env)
    assert res.returncode != 0
    assert str(missing) in res.stderr and "Traceback" not in res.stderr


def test_python_dash_m(model_dir, env):
    """`python -m dlmrt generate ... --max-new-tokens 4 --ignore-eos` works like the script."""
    args = ["-m", "dlmrt", "generate", "--model", str(model_dir), "--max-new-tokens", "4"]
    res = _run([sys.executable, *args, "--ignore-eos", "--stats", "x"], env)
    assert res.returncode == 0, res.stderr
    m = STATS.search(res.stderr)
    assert m and m.group(1) == "4" and m.group(2) == "length"


def test_prompt_from_stdin(model_dir, env):
    """The prompt '-' is read from stdin."""
    args = ["generate", "--model", str(model_dir), "--max-new-tokens", "3", "--stats", "-"]
    res = _run(args, env, input="hello")
    assert res.returncode == 0, res.stderr
    assert STATS.search(res.stderr)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--entropy-budget", "-1"], "entropy_budget"),
        (["--temperature", "-0.1"], "temperature"),
        (["--seed", "-1"], "seed"),
        (["--block-length", "0"], "block_length"),
        (["--dtype", "float64"], "dtype"),
        (["--role", "bad"], "role"),
        (["--mode", "bad"], "mode"),
    ],
)
def test_bad_values_in_process(capsys, args, field):
    """Invalid flag values return exit code 2 with 'dlmrt: error: FIELD: ...' on stderr."""
    assert main(["generate", *args, "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dlmrt: error: {field}:")


def test_argparse_rejects_unknown_rule(capsys):
    """--rule outside the registered rules is an argparse usage error (exit 2)."""
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--rule", "nope", "x"])
    assert exc.value.code == 2
    assert "--rule" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_exits_cleanly(model_dir, capsys):
    """--device cuda on a machine without CUDA is a clean 'device:' error, exit 2."""
    assert main(["generate", "--model", str(model_dir), "--device", "cuda", "x"]) == 2
    assert capsys.readouterr().err.startswith("dlmrt: error: device")


def test_help_imports_no_torch():
    """`dlmrt --help` (every subcommand's parser built) must not pay torch's import (seconds)."""
    import subprocess
    import sys

    code = "import sys, dlmrt.cli; dlmrt.cli.build_parser(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_generate_prints_exactly_the_text_while_it_streams(env):
    """`dlmrt generate` writes the text as its tokens become final (many writes, one per round
    with new final rows): stdout is still exactly the request's text and one newline."""
    from dlmrt import LLM

    prompt = "Tom has 12 apples and buys 7 more, then gives away 5. How many now?"
    want = LLM(device="cpu").generate(prompt, chat=True, threshold=0.999).text
    res = _run(["generate", "--chat", "--threshold", "0.999", prompt], env)
    assert res.returncode == 0, res.stderr
    assert res.stdout == want + "\n"
