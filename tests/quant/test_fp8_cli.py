"""`--quantization` and `--kv-cache-dtype` on generate / serve / bench: parsed, checked against their
choices, and passed to `LLM` (a stand-in records the keyword arguments)."""

from __future__ import annotations

import json

import pytest

import dlmrt.llm
from dlmrt.cli import build_parser, main


class _Stop(ValueError):
    pass


@pytest.fixture
def seen(monkeypatch) -> dict:
    """LLM replaced by a recorder that stops the command once it is called."""
    got: dict = {}

    def fake_llm(**kwargs):
        got.update(kwargs)
        raise _Stop("recorded")

    monkeypatch.setattr(dlmrt.llm, "LLM", fake_llm)
    return got


def _commands(tmp_path) -> dict[str, list[str]]:
    data = tmp_path / "gsm.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    return {
        "generate": ["generate", "x"],
        "serve": ["serve", "--port", "0"],
        "bench": ["bench", "--dataset", str(data), "--no-progress"],
    }


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_flags_reach_llm(tmp_path, seen, command, capsys):
    argv = _commands(tmp_path)[command] + ["--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3"]
    assert main(argv) != 0  # the recorder stopped it
    assert "recorded" in capsys.readouterr().err
    assert seen["quantization"] == "fp8" and seen["kv_cache_dtype"] == "fp8_e4m3"


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_defaults_are_as_stored_and_auto(tmp_path, seen, command):
    main(_commands(tmp_path)[command])
    assert seen["quantization"] is None and seen["kv_cache_dtype"] == "auto"


@pytest.mark.parametrize(
    "flag, value, choices",
    [("--quantization", "int4", "'none', 'fp8'"),
     ("--kv-cache-dtype", "fp8_e5m2", "'auto', 'fp8', 'fp8_e4m3'")],
)  # fmt: skip
def test_a_bad_choice_lists_the_choices(flag, value, choices, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", flag, value, "x"])
    err = capsys.readouterr().err
    assert f"invalid choice: '{value}'" in err and choices in err


def test_generate_with_fp8_flags_end_to_end(tmp_path, capsys):
    """The real LLM: a bf16 checkpoint quantized at load, over the FP8 arena, on the CPU."""
    from conftest import write_checkpoint

    path = write_checkpoint(tmp_path / "m")
    argv = [
        "generate",
        "--model",
        str(path),
        "--dtype",
        "float32",
        "--max-new-tokens",
        "4",
        "--ignore-eos",
        "--quantization",
        "fp8",
        "--kv-cache-dtype",
        "fp8",
        "--stats",
        "x",
    ]
    assert main(argv) == 0
    assert "[4 tokens, finish=length" in capsys.readouterr().err
