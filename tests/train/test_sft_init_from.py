"""`dlmrt train sft --init-from MODEL`: the run starts at MODEL's weights; a model of another
shape, another tokenizer or with a residual adapter is refused before the run directory exists."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from test_train_sft import tiny

from dlmrt.train.trainer import train_sft


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny arithmetic model after 12 steps (block 8): the model directory to start from."""
    out = tmp_path_factory.mktemp("init") / "a"
    train_sft(tiny(steps=12), out, progress=False)
    return out


def test_the_run_starts_at_the_models_weights(trained, tmp_path):
    # lr 1e-12: one step moves no weight by more than ~1e-12, so the saved weights are the start.
    cfg = tiny(steps=1, block_size=16, lr=1e-12, init_from=str(trained))
    res = train_sft(cfg, tmp_path / "b", progress=False)
    start = load_file(str(trained / "model.safetensors"))
    after = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert start.keys() == after.keys()
    for name in start:
        torch.testing.assert_close(after[name], start[name], rtol=0, atol=1e-9)
    fresh = train_sft(tiny(steps=1, block_size=16), tmp_path / "c", progress=False)
    assert res.losses[1] < fresh.losses[1] - 1.0, (res.losses, fresh.losses)  # trained vs ~ln V
    assert json.loads((tmp_path / "b" / "config.json").read_text())["block_size"] == 16


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"hidden_size": 48}, "hidden_size 32"),
        ({"task": "sum_set_small"}, "tokenizer differs"),
    ],
)
def test_another_model_is_refused_before_the_run_exists(trained, tmp_path, overrides, named):
    out = tmp_path / "b"
    with pytest.raises(ValueError, match=named):
        train_sft(tiny(steps=1, init_from=str(trained), **overrides), out, progress=False)
    assert not out.exists()


def test_a_missing_model_or_an_adapter_is_named(trained, tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        train_sft(tiny(steps=1, init_from=str(tmp_path / "nowhere")), tmp_path / "b")
    adapted = tmp_path / "adapted"
    shutil.copytree(trained, adapted, ignore=shutil.ignore_patterns("checkpoints"))
    config = json.loads((adapted / "config.json").read_text())
    config["orl_residual"] = {"kind": "qwen_dlm"}
    (adapted / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="residual adapter"):
        train_sft(tiny(steps=1, init_from=str(adapted)), tmp_path / "c", progress=False)
