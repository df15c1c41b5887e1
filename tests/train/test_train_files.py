"""The files `dlmrt train` writes: every file of a run, its checkpoints and an export is readable
like any new file (0o644 under umask 022; safetensors alone would make the weights 0o600)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_train_sft import tiny

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
