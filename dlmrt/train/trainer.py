"""Block-diffusion SFT loop: `train_sft(cfg, out)`, resumable after a kill with nothing lost.

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

Resuming loads the newest checkpoint, drops log lines after it and continues at its step; since
pack j depends only on j, the continued run is identical to an uninterrupted one (bit for bit
on the CPU). SIGINT/SIGTERM finish the current step, save a checkpoint and return.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlmrt import ops
from dlmrt.models.config import model_config_from_hf
from dlmrt.tasks import get_task
from dlmrt.train.config import TrainConfig
from dlmrt.train.data import SFTPacks
from dlmrt.train.evaluate import evaluate, live_llm
from dlmrt.train.masks import FLEX_TILE, attention_mask
from dlmrt.train.model import build_model, count_parameters
from dlmrt.train.progress import progress_bar
from dlmrt.train.run_dir import open_run, restore, truncate_log
from dlmrt.train.sft_loss import normalizer, sft_loss
from dlmrt.train.stop_flag import StopFlag, ignore_stop_signals

log = logging.getLogger("dlmrt")


@dataclass
class TrainResult:
    out: Path
    step: int  # the last step taken (== cfg.steps unless interrupted)
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss, this process's steps
    evals: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr for optimizer step `step` (0-based): linear warm-up, cosine decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def resolve_device(cfg: TrainConfig) -> torch.device:
    if cfg.device is not None:
        device = torch.device(cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {cfg.device!r} requested but CUDA is not available")
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
    device = resolve_device(cfg)
    cfg = resolved(cfg, device)
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
    truncate_log(out / "log.jsonl", step)
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and cuda)
    run = _Run(cfg, out, model, optimizer, scheduler, device, model_cfg.block_size, bf16)
    result = TrainResult(out, step)
    log.info(
        "model %.2fM parameters; %d packs of %d rows per step, attention %s, %s, %d data "
        "workers, on %s",
        count_parameters(model) / 1e6, cfg.grad_accum, cfg.pack_rows, cfg.attention,
        "bf16 autocast" if bf16 else "fp32", cfg.data_workers, device,
    )  # fmt: skip
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
            step = run.loop(step, train_time, batches_in, log_file, stop, ckpts, result,
                            progress_bar(cfg.steps, step, progress), on_step)  # fmt: skip
        finally:
            ops.use(None)
            del batches_in  # stops the data workers
    result.step = step
    return result


@dataclasses.dataclass
class _Run:
    """The training loop's fixed parts; `loop` runs steps until the end or a stop signal."""

    cfg: TrainConfig
    out: Path
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    device: torch.device
    block: int
    bf16: bool

    def step(self, batches) -> tuple[torch.Tensor, float]:
        """One optimizer step over `batches`; returns ([loss, grad norm] on the device, lr)."""
        cfg = self.cfg
        autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()
        )
        denominator = normalizer(batches, cfg.loss_weighting)
        loss = torch.zeros((), device=self.device)
        for batch in batches:
            batch = batch.to(self.device)
            attn = attention_mask(batch.meta, cfg.attention)
            with autocast:
                part = sft_loss(
                    self.model, batch, attn, self.block, cfg.loss_weighting, denominator
                )
            part.backward()
            loss += part.detach()
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        lr = self.scheduler.get_last_lr()[0]  # this step's learning rate
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return torch.stack([loss.float(), grad_norm.float()]), lr

    def evaluate(self, step: int, write, result: TrainResult, bar) -> None:
        cfg = self.cfg
        res = evaluate(
            live_llm(self.model, self.out, self.device), get_task(cfg.task), cfg.eval_problems,
            cfg.chat_fraction, rule="threshold", threshold=cfg.eval_threshold,
            max_new_tokens=cfg.eval_max_new_tokens,
        )  # fmt: skip
        write({"step": step, "eval": res})
        result.evals.append({"step": step, **res})
        bar.set_postfix(acc=f"{res['accuracy']:.3f}", tpf=f"{res['tokens_per_forward']:.2f}")

    def loop(
        self, step, train_time, batches_in, log_file, stop, ckpts, result, bar, on_step
    ) -> int:
        cfg = self.cfg

        def write(entry: dict[str, Any]) -> None:
            log_file.write(json.dumps(entry) + "\n")
            log_file.flush()

        pending: list[torch.Tensor] = []
        t_last, examples, masked = time.perf_counter(), 0, 0
        while step < cfg.steps:
            t0 = time.perf_counter()
            batches = [next(batches_in) for _ in range(cfg.grad_accum)]
            stats, lr = self.step(batches)
            step += 1
            pending.append(stats)
            examples += sum(b.num_examples for b in batches)
            masked += sum(b.num_masked for b in batches)
            train_time += time.perf_counter() - t0
            stopping = stop.set  # read once: a signal during eval/save waits a step
            save = step % cfg.save_every == 0 or step == cfg.steps or stopping
            if save or step % cfg.log_every == 0:  # the log is complete up to a checkpoint
                now = time.perf_counter()
                entry = _log_entry(
                    pending, step, result, lr, examples, masked, now - t_last, train_time
                )
                write(entry)
                bar.set_postfix(loss=f"{entry['loss']:.4f}", refresh=False)
                pending, t_last, examples, masked = [], now, 0, 0
            bar.update()
            if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
                self.evaluate(step, write, result, bar)
                t_last = time.perf_counter()
            if save:
                ckpts.save(
                    step, self.model, self.optimizer, self.scheduler, {"train_time_s": train_time}
                )
                t_last = time.perf_counter()
            if stopping:
                result.interrupted = True
                break
            if on_step is not None:
                on_step(step)
        bar.close()
        return step


def _log_entry(pending, step, result, lr, examples, masked, seconds, train_time) -> dict[str, Any]:
    """One log line for the steps in `pending` (one host sync); records their losses in `result`."""
    values = torch.stack(pending).cpu()
    for i, v in enumerate(values[:, 0].tolist()):
        result.losses[step - len(pending) + 1 + i] = v
    return {
        "step": step,
        "loss": values[:, 0].mean().item(),
        "grad_norm": values[:, 1].mean().item(),
        "lr": lr,
        "examples": examples,
        "masked_tokens": masked,
        "steps_per_s": len(pending) / max(seconds, 1e-9),
        "train_time_s": round(train_time, 3),
    }
