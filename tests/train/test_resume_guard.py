"""`dlmrt train sft --resume` on a directory without a run is an error, not a fresh full run."""

from __future__ import annotations

from dlmrt.cli import main


def test_resume_of_a_directory_without_a_run_is_an_error(tmp_path, capsys):
    for out in (tmp_path / "missing", tmp_path):  # absent, and present but empty
        code = main(["train", "sft", "--out", str(out), "--resume", "--steps", "1"])
        assert code == 2
        assert f"--resume: {out} holds no run" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists() and not list(tmp_path.iterdir())
