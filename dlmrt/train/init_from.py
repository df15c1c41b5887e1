"""`TrainConfig.init_from`: start an SFT run from a trained model's weights instead of random ones.

The use is continuing a Base under a changed setting, for example another `--block-size` (SDAR
changes B by continued training; the weights do not depend on B). The network and the tokenizer
must be the run's own: the model directory's `config.json` is compared field by field with the
run's, and its `tokenizer.json` with the one the run trains for its task, before the run
directory is written (a bad `init_from` leaves no run behind); a mismatch names what differs. A
model with an ORL residual adapter is refused (SFT trains no adapter, and silently dropping it
would change the model). Resuming ignores `init_from`: the checkpoint's weights continue the run.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import torch

from dlmrt.json_file import read_json
from dlmrt.train.config import TrainConfig
from dlmrt.train.export import WEIGHTS
from dlmrt.train.model import load_weights
from dlmrt.train.run_dir import setup_run_dir

log = logging.getLogger("dlmrt")

# config.json fields that fix the weights' shapes and meaning (block_size and rope do not).
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


def check_init_from(cfg: TrainConfig) -> None:
    """Raise ValueError naming what makes `cfg.init_from` unfit to start a run of `cfg` (the
    run's config and tokenizer are built in a temporary directory to compare against)."""
    with tempfile.TemporaryDirectory() as tmp:
        setup_run_dir(cfg, Path(tmp))
        check_init_dir(Path(cfg.init_from), Path(tmp))


def check_init_dir(src: Path, out: Path) -> None:
    """Raise ValueError naming what makes `src` unfit to start the run whose files are in `out`."""
    for name in ("config.json", "tokenizer.json", WEIGHTS):
        if not (src / name).is_file():
            raise ValueError(f"init_from: {src} has no {name} (expected a model directory)")
    theirs = read_json(src / "config.json")  # unreadable or not an object: a CheckpointError
    if "orl_residual" in theirs:
        raise ValueError(
            f"init_from: {src} has an ORL residual adapter; SFT starts from a model without one"
        )
    if (src / "tokenizer.json").read_text() != (out / "tokenizer.json").read_text():
        raise ValueError(
            f"init_from: {src}'s tokenizer differs from the one this run trains (the task, "
            "vocab_size and tokenizer_problems must be the model's)"
        )
    ours = json.loads((out / "config.json").read_text())
    differ = [
        f"{k} {theirs.get(k)!r} (this run: {ours.get(k)!r})"
        for k in SHAPE_FIELDS
        if theirs.get(k) != ours.get(k)
    ]
    if differ:
        raise ValueError(
            f"init_from: {src} has another shape: {'; '.join(differ)}; pass its shape flags"
        )


def init_from(model: torch.nn.Module, src: str | Path) -> None:
    """Copy the weights of model directory `src` (checked by `check_init_from`) into `model`."""
    src = Path(src)
    load_weights(model, src / WEIGHTS)
    log.info("initial weights from %s", src)
