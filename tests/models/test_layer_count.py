"""A config.json claiming more layers than the checkpoint's tensors hold fails before the model is
built, naming num_hidden_layers (building 100000 layers first took minutes, then every extra
layer was reported missing)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
from conftest import write_checkpoint

from dlmrt.errors import CheckpointError
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.train.orl.start import load_trainable

CPU = torch.device("cpu")


def _claim(path: Path, layers: int) -> dict:
    raw = json.loads((path / "config.json").read_text())
    raw["num_hidden_layers"] = layers
    (path / "config.json").write_text(json.dumps(raw))
    return raw


def _message(path: Path, layers: int) -> str:
    return re.escape(
        f"{path / 'config.json'}: num_hidden_layers is {layers}, but the checkpoint's tensors "
        "hold 2 layer(s) (layers.0 .. layers.1)"
    )


@pytest.mark.parametrize("layers", [3, 100_000])
def test_the_engine_loader_refuses_before_building(tmp_path, layers):
    path = write_checkpoint(tmp_path / "m")  # 2 layers
    _claim(path, layers)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=_message(path, layers)):
        load_checkpoint(path, torch.float32, CPU)
    assert time.monotonic() - start < 10


def test_the_trainer_loader_refuses_before_building(tmp_path):
    path = write_checkpoint(tmp_path / "m")
    raw = _claim(path, 100_000)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=_message(path, 100_000)):
        load_trainable(path, raw, CPU, 0)
    assert time.monotonic() - start < 10


def test_fewer_layers_than_the_tensors_hold_is_the_strict_check_s(tmp_path):
    """One layer claimed, two stored: the strict check names the unexpected tensors as before."""
    path = write_checkpoint(tmp_path / "m")
    _claim(path, 1)
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) \['model\.layers\.1\."):
        load_checkpoint(path, torch.float32, CPU)
