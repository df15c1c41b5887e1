"""The SFT run's loop (`trainer.train_sft` sets it up): optimizer steps over packs, log lines,
evaluations through the live model, checkpoints, and the stop signal honoured between steps."""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlmrt.tasks import get_task
from dlmrt.train.config import TrainConfig
from dlmrt.train.evaluate import evaluate, live_llm
from dlmrt.train.masks import attention_mask
from dlmrt.train.sft_loss import normalizer, sft_loss


@dataclass
class TrainResult:
    out: Path
    step: int  # the last step taken (== cfg.steps unless interrupted)
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss, this process's steps
    evals: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False


@dataclasses.dataclass
class SFTRun:
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
            live_llm(self.model, self.out, self.device),
            get_task(cfg.task),
            cfg.eval_problems,
            cfg.chat_fraction,
            rule="threshold",
            threshold=cfg.eval_threshold,
            max_new_tokens=cfg.eval_max_new_tokens,
        )
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
                entry = log_entry(
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


def log_entry(pending, step, result, lr, examples, masked, seconds, train_time) -> dict[str, Any]:
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
