"""A non-finite or out-of-range training knob is refused up front, naming the field, before any run
directory is written (a NaN learning rate used to fail only at the optimizer, an inf one to train
NaN weights)."""

from __future__ import annotations

import time

import pytest

from dlmrt.cli import main
from dlmrt.train.config import TrainConfig
from dlmrt.train.orl.config import ORLConfig

BAD = [
    ("lr", "nan"),
    ("lr", "inf"),
    ("lr", "-inf"),
    ("beta2", "nan"),
    ("beta1", "1.5"),
    ("weight_decay", "nan"),
    ("grad_clip", "inf"),
]


@pytest.mark.parametrize("command", ["sft", "orl"])
@pytest.mark.parametrize(("field", "value"), BAD)
def test_the_cli_refuses_at_once_and_writes_nothing(tmp_path, capsys, command, field, value):
    out = tmp_path / "run"
    flag = "--" + field.replace("_", "-")
    start = time.monotonic()
    assert main(["train", command, "--out", str(out), "--steps", "1", f"{flag}={value}"]) == 2
    assert time.monotonic() - start < 10  # no tokenizer, model or data was built first
    assert f"{field}: must be" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("config", [TrainConfig, ORLConfig])
def test_every_float_field_must_be_finite(config):
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"^lr: must be a finite number, got {value}"):
            config(lr=value)


def test_the_rollout_temperature_is_a_sampling_temperature():
    with pytest.raises(ValueError, match="^temperature: must be 0 .greedy. or at least"):
        ORLConfig(temperature=1e-39)
    with pytest.raises(ValueError, match="^temperature"):
        ORLConfig(temperature=float("inf"))
