"""The run directory of `train_orl`: like SFT's (`dlmrt/train/run_dir.py`, whose checkpointer,
log truncation and restore it reuses), with `orl_config.json` for the run's ORLConfig.

A new run writes the start model's HF files (its config.json with the `orl_residual` block, as
added or rescaled), so OUT loads with `LLM(OUT, role="orl")` once the first checkpoint is in. A
resumed run builds the model from its newest checkpoint (never rescaled again).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import torch

from dlmrt.styles.decoder_defaults import KEY as DECODER_KEY
from dlmrt.train.export import HF_FILES, WEIGHTS, copy_atomic, latest_checkpoint, write_json
from dlmrt.train.orl import dist
from dlmrt.train.orl.config import RESUMABLE, ORLConfig
from dlmrt.train.orl.start import load_trainable, read_config, start_model
from dlmrt.train.run_dir import Checkpointer, check_out_dir

log = logging.getLogger("dlmrt")
CONFIG = "orl_config.json"


def check_resume(cfg: ORLConfig, saved: ORLConfig) -> None:
    changed = [
        f.name
        for f in dataclasses.fields(ORLConfig)
        if f.name not in RESUMABLE and getattr(cfg, f.name) != getattr(saved, f.name)
    ]
    if changed:
        raise ValueError(
            f"resume: {', '.join(changed)} differ from the run's {CONFIG}; only "
            f"{', '.join(RESUMABLE)} may change on resume"
        )


def model_path(cfg: ORLConfig) -> Path:
    if cfg.model is None:
        from dlmrt.demo import demo_model_path

        return demo_model_path()
    path = Path(cfg.model)
    if not path.is_dir():
        raise ValueError(f"--model: {path} does not exist or is not a directory")
    return path


def _write_start(model, raw: dict, src: Path, out: Path) -> None:
    missing = [n for n in HF_FILES[1:] if not (src / n).is_file()]
    if missing:
        raise ValueError(f"--model: {src} lacks {', '.join(missing)}")
    for name in HF_FILES[1:]:
        shutil.copyfile(src / name, out / name)
    write_json(out / "config.json", raw)
    gen = json.loads((out / "generation_config.json").read_text())
    if gen.pop(DECODER_KEY, None) is not None:  # the start model's decoder is not the run's
        log.info("ORL run: the start model's %r entry is not copied", DECODER_KEY)
        write_json(out / "generation_config.json", gen)


def _check(cfg: ORLConfig, out: Path, resume: bool) -> Path | None:
    """The newest checkpoint to resume from (None: start); errors for a wrong `out` / `resume`."""
    check_out_dir(out)
    config_path = out / CONFIG
    ckpt = latest_checkpoint(out) if resume else None
    if resume and ckpt is None and not config_path.is_file():
        raise ValueError(
            f"--resume: {out} holds no ORL run (no {CONFIG}, no checkpoints); drop --resume"
        )
    if resume and config_path.is_file():
        check_resume(cfg, ORLConfig.load(config_path))
    elif not resume and (config_path.exists() or (out / "checkpoints").exists()):
        raise ValueError(f"out: {out} already holds a run; pass --resume or another --out")
    return ckpt


def open_orl_run(cfg: ORLConfig, out: Path, resume: bool, device: torch.device, rank: int = 0):
    """(model, checkpoint or None, checkpointer): the run's model and where it resumes from.

    Every rank checks OUT and builds the same model (deterministically); rank 0 alone writes."""
    ckpt = _check(cfg, out, resume)
    dist.barrier()  # every rank has checked OUT before rank 0 writes to it
    ckpts = Checkpointer(out, cfg.keep_checkpoints)
    if ckpt is None:  # a new run (or one killed before its first checkpoint): from the start
        src = model_path(cfg)
        model, raw = start_model(cfg, src, device)
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            ckpts.clean()
            _write_start(model, raw, src, out)
    else:
        model = load_trainable(ckpt, read_config(ckpt), device, cfg.seed)
        if rank == 0:
            ckpts.clean()
            for name in (*HF_FILES, WEIGHTS):
                copy_atomic(ckpt / name, out / name)
    if rank == 0:
        write_json(out / CONFIG, dataclasses.asdict(cfg))
    dist.barrier()
    return model, ckpt, ckpts


def saved_config(out: Path) -> ORLConfig | None:
    path = out / CONFIG
    return ORLConfig.from_dict(json.loads(path.read_text()), str(path)) if path.is_file() else None
