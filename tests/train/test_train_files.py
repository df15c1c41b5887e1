"""The files `dlmrt train` writes and the paths it is given: every file of a run, its checkpoints
and an export is readable like any new file (0o644 under umask 022; safetensors alone would make
the weights 0o600); an `--out` that is a file is a clear error (`train eval --out`: checked
before the run); `train eval --help` shows the defaults."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from test_train_sft import tiny

from dlmrt.cli import build_parser, main
from dlmrt.train.export import export
from dlmrt.train.trainer import train_sft


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in root.rglob("*")}


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask-022", "umask-027"])
def test_run_checkpoint_and_export_files_get_the_umask_mode(tmp_path, umask) -> None:
    old = os.umask(umask)
    try:
        train_sft(tiny(steps=1), tmp_path / "run", progress=False)
        export(tmp_path / "run", tmp_path / "shipped")
        export(tmp_path / "run", tmp_path / "shipped-fp32", "float32")
    finally:
        os.umask(old)
    modes = {**_modes(tmp_path / "run"), **_modes(tmp_path / "shipped")}
    modes |= {"fp32/" + k: v for k, v in _modes(tmp_path / "shipped-fp32").items()}
    assert "checkpoints/step-0000001/model.safetensors" in modes and "model.safetensors" in modes
    for name, mode in modes.items():
        is_dir = any(other.startswith(name + "/") for other in modes)
        expected = (0o777 if is_dir else 0o666) & ~umask
        assert mode == expected, f"{name}: {oct(mode)}, expected {oct(expected)}"


@pytest.mark.parametrize("resume", [False, True])
def test_sft_out_that_is_a_file_is_an_error(tmp_path, capsys, resume) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("keep me\n")
    for out in (path, path / "run"):  # the file itself, or a directory under it
        argv = ["train", "sft", "--out", str(out), "--steps", "1", "--no-progress"]
        assert main(argv + ["--resume"] * resume) == 2
        assert f"--out: {path} is a file, not a directory" in capsys.readouterr().err
    assert path.read_text() == "keep me\n"


@pytest.mark.parametrize("out", ["dir", "missing/result.json"])
def test_eval_out_is_checked_before_the_run(tmp_path, capsys, out) -> None:
    (tmp_path / "dir").mkdir()
    argv = ["train", "eval", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--out: {tmp_path / out}" in err and "no-model" not in err  # before loading the model


def _subparser(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def test_eval_help_shows_every_default(capsys) -> None:
    """Every optional flag that takes a value says its default (as the other subcommands do)."""
    ev = _subparser(build_parser(), "train", "eval")
    takes_value = [a for a in ev._actions if a.option_strings and a.nargs != 0 and not a.required]
    assert {"--task", "--threshold", "--device", "--mode"} <= {
        a.option_strings[0] for a in takes_value
    }
    with pytest.raises(SystemExit):
        main(["train", "eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for action in takes_value:
        assert action.help and "(default" in action.help, f"{action.option_strings[0]}: no default"
        assert " ".join(action.help.split()) in text


def test_export_records_the_models_default_decoder(tmp_path, capsys) -> None:
    """`train export --rule/--threshold/--entropy-budget` write generation_config.json's
    'dlmrt_decoder', which the loaded model then decodes with; a bad value writes nothing."""
    import json

    from dlmrt import LLM
    from dlmrt.styles.decoder_defaults import DecoderDefaults

    train_sft(tiny(steps=1), tmp_path / "run", progress=False)
    argv = ["train", "export", str(tmp_path / "run"), str(tmp_path / "shipped")]
    assert main(argv + ["--rule", "entropy_budget", "--entropy-budget", "0.4"]) == 0
    gen = json.loads((tmp_path / "shipped" / "generation_config.json").read_text())
    assert gen["dlmrt_decoder"] == {"rule": "entropy_budget", "entropy_budget": 0.4}
    assert gen["eos_token_id"]  # the run's entries kept
    llm = LLM(tmp_path / "shipped", device="cpu")
    assert llm.decoder == DecoderDefaults("entropy_budget", 0.9, 0.4)

    assert main(argv[:3] + [str(tmp_path / "bad"), "--threshold", "1.5"]) == 2
    assert "'dlmrt_decoder': threshold: must be in [0.0, 1.0], got 1.5" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert main(argv[:3] + [str(tmp_path / "plain")]) == 0  # no knobs: nothing recorded
    assert "dlmrt_decoder" not in (tmp_path / "plain" / "generation_config.json").read_text()
    assert main(argv[:2] + [str(tmp_path / "shipped"), str(tmp_path / "copy")]) == 0
    copied = json.loads((tmp_path / "copy" / "generation_config.json").read_text())
    assert copied["dlmrt_decoder"] == gen["dlmrt_decoder"]  # no knobs: the source's entry kept
