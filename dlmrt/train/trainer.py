"""Block-diffusion SFT: `train_sft(cfg, out)` (the loop: `sft_run.py`), resumable after a kill.

Per step: `grad_accum` packs of train examples (pack j is a pure function of the run and j:
its examples and its noise, see `data.SFTPacks`; DataLoader workers build them ahead on CUDA)
-> one forward per pack over [clean | noisy] under the block-diffusion mask (flex_attention on
CUDA, dense SDPA twin on CPU) -> masked-token CE -> AdamW (warm-up + cosine), gradient
clipping, bf16 autocast on CUDA. Every `eval_every` steps the live model is evaluated through
`LLM.generate` (threshold rule) on held-out problems.

Run directory OUT (`run_dir.py` writes and restores it):
  config.json generation_config.json tokenizer.json tokenizer_config.json model.safetensors
      an HF model directory of the latest checkpoint: `LLM(OUT)` / `dlmrt generate --model OUT`
  train_config.json   the run's TrainConfig (per-device defaults filled in)
  log.jsonl           one line per `log_every` steps (loss, lr, grad norm, ...) and per evaluation
  checkpoints/step-N  HF files + trainer_state.pt (optimizer, scheduler, step, RNG states, train
                      time) + trainer_state.json; written to a temporary directory and renamed,
                      so a kill leaves either the whole checkpoint or none

A new run starts from random weights (`model.init_weights`) or, with `init_from`, from a trained
model's (`init_from.py`: same shape and tokenizer, checked first). Resuming loads the newest
checkpoint, drops log lines after it and continues at its step; since
pack j depends only on j, the continued run is identical to an uninterrupted one (bit for bit
on the CPU). SIGINT/SIGTERM finish the current step, save a checkpoint and return.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path

import torch

from dlmrt import ops
from dlmrt.models.config import model_config_from_hf
from dlmrt.train.config import TrainConfig
from dlmrt.train.data import SFTPacks
from dlmrt.train.init_from import check_init_from, init_from
from dlmrt.train.masks import FLEX_TILE
from dlmrt.train.model import build_model, count_parameters
from dlmrt.train.progress import progress_bar
from dlmrt.train.run_dir import open_run, restore, truncate_log
from dlmrt.train.sft_run import SFTRun, TrainResult
from dlmrt.train.stop_flag import StopFlag, ignore_stop_signals

log = logging.getLogger("dlmrt")


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr for optimizer step `step` (0-based): linear warm-up, cosine decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def resolve_device(name: str | None) -> torch.device:
    """A trainer's `device` setting: cpu | cuda | cuda:N, or None for cuda when available."""
    if name is not None:
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {name!r} requested but CUDA is not available")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on the layers' matrices; none on norms and the (tied) embedding."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed_tokens" not in name else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def resolved(cfg: TrainConfig, device: torch.device) -> TrainConfig:
    """`cfg` with the per-device defaults (batch shape, attention, workers) filled in."""
    cuda = device.type == "cuda"
    rows, accum = cfg.batch_shape(device.type)
    attention = cfg.attention if cfg.attention != "auto" else ("flex" if cuda else "dense")
    if attention == "flex":
        if not cuda:
            raise ValueError("attention: flex needs CUDA (flex_attention has no CPU backward)")
        rows = -(-rows // FLEX_TILE) * FLEX_TILE
    workers = cfg.data_workers
    if workers is None:
        workers = min(8, max((os.cpu_count() or 1) - 2, 0)) if cuda else 0
    return dataclasses.replace(
        cfg, pack_rows=rows, grad_accum=accum, attention=attention, data_workers=workers
    )


def _loader(packs: SFTPacks, start: int, stop: int, workers: int, pin: bool):
    """Packs start..stop-1 in order; worker processes (spawned: CUDA-safe) build them ahead."""
    if workers == 0:
        return (packs[j] for j in range(start, stop))
    loader = torch.utils.data.DataLoader(
        packs,
        sampler=range(start, stop),
        batch_size=None,
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=4,
        multiprocessing_context="spawn",
        worker_init_fn=ignore_stop_signals,
    )
    return iter(loader)


def train_sft(
    cfg: TrainConfig,
    out: str | Path,
    resume: bool = False,
    progress: bool = True,
    on_step=None,  # hook: on_step(step) at the end of every step (tests simulate a kill)
) -> TrainResult:
    """Train (or, with `resume`, continue) an SFT run in `out`. See the module docstring."""
    out = Path(out)
    device = resolve_device(cfg.device)
    cfg = resolved(cfg, device)
    if cfg.init_from is not None and not resume:
        check_init_from(cfg)  # before open_run writes the run directory
    ckpt, ckpts = open_run(cfg, out, resume)
    model_cfg = model_config_from_hf(json.loads((out / "config.json").read_text()), out)
    model = build_model(model_cfg, device, cfg.seed)
    cuda = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        **({"fused": True} if cuda else {}),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    step, train_time = restore(ckpt, model, optimizer, scheduler, out)
    if ckpt is None and cfg.init_from is not None:
        init_from(model, cfg.init_from)
    truncate_log(out / "log.jsonl", step)
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and cuda)
    run = SFTRun(cfg, out, model, optimizer, scheduler, device, model_cfg.block_size, bf16)
    result = TrainResult(out, step)
    _log_plan(cfg, model, bf16, device)
    with open(out / "log.jsonl", "a") as log_file, StopFlag() as stop:
        if ckpt is not None:
            log_file.write(json.dumps({"step": step, "event": "resume"}) + "\n")
        packs = SFTPacks(
            cfg.task, out, model_cfg.block_size, cfg.pack_rows, cfg.chat_fraction, cfg.seed
        )
        accum = cfg.grad_accum
        batches_in = _loader(packs, step * accum, cfg.steps * accum, cfg.data_workers, cuda)
        ops.use("torch")  # Triton kernels have no autograd: training runs the torch twins
        try:
            step = run.loop(
                step,
                train_time,
                batches_in,
                log_file,
                stop,
                ckpts,
                result,
                progress_bar(cfg.steps, step, progress),
                on_step,
            )
        finally:
            ops.use(None)
            del batches_in  # stops the data workers
    result.step = step
    return result


def _log_plan(cfg: TrainConfig, model: torch.nn.Module, bf16: bool, device: torch.device) -> None:
    """The run's shape, logged once at the start."""
    log.info(
        "model %.2fM parameters; %d packs of %d rows per step, attention %s, %s, %d data "
        "workers, on %s",
        count_parameters(model) / 1e6,
        cfg.grad_accum,
        cfg.pack_rows,
        cfg.attention,
        "bf16 autocast" if bf16 else "fp32",
        cfg.data_workers,
        device,
    )
