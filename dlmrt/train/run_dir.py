"""The run directory of `train_sft`: its files, its checkpoints, and resuming from them.

OUT holds an HF model directory of the latest checkpoint (config.json, generation_config.json,
tokenizer files, model.safetensors), train_config.json, log.jsonl and checkpoints/step-N (HF files
+ trainer_state.pt with optimizer, scheduler, step, RNG states and train time, + a readable
trainer_state.json), each written to a temporary directory and renamed, so a kill leaves either
the whole checkpoint or none.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from dlmrt.errors import CheckpointError
from dlmrt.tasks import get_task
from dlmrt.train.config import RESUMABLE, TrainConfig
from dlmrt.train.disk_full import save_torch, writing
from dlmrt.train.export import (
    HF_FILES,
    WEIGHTS,
    copy_atomic,
    generation_config,
    latest_checkpoint,
    write_json,
)
from dlmrt.train.model import load_weights, save_weights
from dlmrt.train.tokenizer import SPECIALS, save_tokenizer, task_corpus, train_tokenizer

log = logging.getLogger("dlmrt")
STATE = "trainer_state.pt"


def check_resume(cfg: TrainConfig, saved: TrainConfig) -> None:
    changed = [
        f.name
        for f in dataclasses.fields(TrainConfig)
        if f.name not in RESUMABLE and getattr(cfg, f.name) != getattr(saved, f.name)
    ]
    if changed:
        raise ValueError(
            f"resume: {', '.join(changed)} differ from the run's train_config.json; only "
            f"{', '.join(RESUMABLE)} may change on resume"
        )
    if cfg.steps != saved.steps:
        log.warning("resume: steps %d -> %d reshapes the cosine schedule", saved.steps, cfg.steps)


def setup_run_dir(cfg: TrainConfig, out: Path) -> None:
    """Tokenizer and model config files of a new run (deterministic: safe to redo)."""
    task = get_task(cfg.task)
    tok = train_tokenizer(task_corpus(task, cfg.tokenizer_problems), cfg.vocab_size)
    specials = {name: tok.token_to_id(name) for name in SPECIALS}
    vocab = -(-tok.get_vocab_size() // 64) * 64
    save_tokenizer(tok, out, cfg.max_position_embeddings)
    write_json(out / "config.json", cfg.hf_config(vocab, specials))
    write_json(out / "generation_config.json", generation_config(specials))
    write_json(out / "train_config.json", dataclasses.asdict(cfg))


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def truncate_log(path: Path, step: int) -> None:
    """Keep the log lines of steps <= `step` (a resumed run rewrites the later ones)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        if entry.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


class Checkpointer:
    def __init__(self, out: Path, keep: int) -> None:
        self.out, self.keep = out, keep
        self.root = out / "checkpoints"

    def save(self, step: int, model, optimizer, scheduler, state: dict[str, Any]) -> Path:
        """checkpoints/step-N, complete or not at all: written under .step-N.tmp and renamed.
        A failed write (a full disk) removes the partial directory and names the step; the
        checkpoints already there are untouched."""
        final = self.root / f"step-{step:07d}"
        tmp = self.root / f".step-{step:07d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            self._write(tmp, step, model, optimizer, scheduler, state)
        except (
            OSError,
            RuntimeError,
        ) as e:  # a full disk: DiskFull (`disk_full.py`) names the file
            shutil.rmtree(tmp, ignore_errors=True)
            raise OSError(
                f"saving checkpoint step {step} under {self.root} failed ({e}); "
                "the earlier checkpoints are unchanged"
            ) from e
        if final.exists():  # the same step saved by an earlier, interrupted process
            shutil.rmtree(final)
        os.replace(tmp, final)
        copy_atomic(final / WEIGHTS, self.out / WEIGHTS)
        steps = sorted(p for p in self.root.glob("step-*") if p.is_dir())
        for old in steps[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def _write(self, tmp: Path, step: int, model, optimizer, scheduler, state) -> None:
        tmp.mkdir(parents=True)
        for name in HF_FILES:
            with writing(tmp / name):
                shutil.copyfile(self.out / name, tmp / name)
        save_weights(model, tmp / WEIGHTS)  # `save_tensors`: DiskFull on a full disk
        full = {
            **state,
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
        }
        save_torch(full, tmp / STATE)
        summary = {k: v for k, v in state.items() if isinstance(v, int | float | str)}
        with writing(tmp / "trainer_state.json"):
            (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **summary}, indent=2))

    def clean(self) -> None:
        for tmp in self.root.glob(".step-*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)


def check_out_dir(out: Path) -> None:
    """`out`, or the nearest of its parents that exists, must be a directory (not a file)."""
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ValueError(f"--out: {existing} is a file, not a directory")


def open_run(cfg: TrainConfig, out: Path, resume: bool):
    """Check `out` against `resume`, prepare the run directory; return (checkpoint, checkpointer)."""
    check_out_dir(out)
    config_path = out / "train_config.json"
    ckpt = latest_checkpoint(out) if resume else None
    if resume and ckpt is None and not config_path.is_file():
        # A typo in --out must not silently start a new full-size run.
        raise ValueError(
            f"--resume: {out} holds no run (no train_config.json, no checkpoints); "
            "drop --resume to start one there"
        )
    if resume and config_path.is_file():
        check_resume(cfg, TrainConfig.load(config_path))
    elif not resume and (config_path.exists() or (out / "checkpoints").exists()):
        raise ValueError(f"out: {out} already holds a run; pass --resume or another --out")
    out.mkdir(parents=True, exist_ok=True)
    ckpts = Checkpointer(out, cfg.keep_checkpoints)
    ckpts.clean()
    if ckpt is None:
        setup_run_dir(cfg, out)
    else:  # the checkpoint's files are the run's
        for name in HF_FILES:
            copy_atomic(ckpt / name, out / name)
    write_json(config_path, dataclasses.asdict(cfg))
    return ckpt, ckpts


def load_state(path: Path) -> dict[str, Any]:
    """A trainer_state.pt, unpickled with torch's weights-only loader: tensors, numbers,
    strings and containers (all that `Checkpointer` writes), never code a planted file names."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path}: refused, it holds more than tensors, numbers, strings and containers "
            f"(not a trainer state dlmrt wrote): {str(e).splitlines()[0]}"
        ) from None


def restore(ckpt, model, optimizer, scheduler, out: Path) -> tuple[int, float]:
    """Load weights, optimizer, scheduler and RNG state from a checkpoint; (step, train time)."""
    if ckpt is None:
        return 0, 0.0
    load_weights(model, ckpt / WEIGHTS)
    state = load_state(ckpt / STATE)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    log.info("resuming %s at step %d", out, state["step"])
    return state["step"], state["train_time_s"]
