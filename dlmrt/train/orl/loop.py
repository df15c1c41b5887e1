"""`train_orl(cfg, out)`: the ORL loop, resumable after a kill with nothing lost.

Per step u: the step's prompts (a pure function of u) -> G rollouts each with the current weights
through dlmrt's engine (seeds a pure function of (seed, u, prompt, rollout)) -> verifier pool ->
plan, packed staircase replay, CE + AEC (+ gated CE and capped RKL) -> one AdamW step if any
rollout was verified (else none, logged) -> trajectories dropped. `log.jsonl` gets one line per
step; checkpoints are atomic (`dlmrt/train/run_dir.py: Checkpointer`). Since a step depends only on
the weights and u, a resumed run repeats an uninterrupted one (bit for bit on the CPU).

`rollout_refresh` N > 1 (the off-policy ablation): the rollouts run a frozen copy of the model,
overwritten with the trained weights at every step u with u % N == 0 (and at a resume, which
therefore repeats an uninterrupted run only when it resumes at such a step); evaluations run the
trained weights.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlmrt import ops
from dlmrt.config import EAGER
from dlmrt.llm import LLM
from dlmrt.tokenizer import Tokenizer
from dlmrt.train.evaluate import evaluate
from dlmrt.train.orl import dist
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.residual_probe import ResidualProbe
from dlmrt.train.orl.rollout import VerifierPool, generate_rollouts, step_prompts
from dlmrt.train.orl.run_dir import open_orl_run
from dlmrt.train.orl.step import Replayer, optimizer_step, param_groups
from dlmrt.train.orl.tasks import resolve_task
from dlmrt.train.progress import progress_bar
from dlmrt.train.run_dir import restore, truncate_log
from dlmrt.train.stop_flag import StopFlag
from dlmrt.train.trainer import resolve_device

log = logging.getLogger("dlmrt")


@dataclass
class ORLResult:
    out: Path
    step: int
    entries: list[dict[str, Any]] = field(default_factory=list)  # this process's step lines
    interrupted: bool = False


def _device(cfg: ORLConfig) -> torch.device:
    return dist.local_device(resolve_device(cfg.device))


def _attention(cfg: ORLConfig, device: torch.device) -> str:
    if cfg.attention == "auto":
        return "flex" if device.type == "cuda" else "dense"
    if cfg.attention == "flex" and device.type != "cuda":
        raise ValueError("attention: flex needs CUDA (flex_attention has no CPU backward)")
    return cfg.attention


def _snapshot(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of `model` for off-policy rollouts (refreshed in place: graphs stay valid)."""
    snap = copy.deepcopy(model).eval()
    snap.requires_grad_(False)
    return snap


def _warmup(cfg: ORLConfig):
    return lambda s: min(1.0, (s + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0


def train_orl(
    cfg: ORLConfig, out: str | Path, resume: bool = False, progress: bool = True, on_step=None
) -> ORLResult:
    """Train (or, with `resume`, continue) an ORL run in `out`. See the module docstring."""
    out, device = Path(out), _device(cfg)
    rank, world = dist.init(device)
    model, ckpt, ckpts = open_orl_run(cfg, out, resume, device, rank)
    optimizer = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup(cfg))
    step, train_time = restore(ckpt, model, optimizer, scheduler, out)
    if rank == 0:
        truncate_log(out / "log.jsonl", step)
    cuda = device.type == "cuda"
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and cuda)
    replayer = Replayer(cfg, model, device, _attention(cfg, device), bf16, (rank, world))
    snapshot = _snapshot(model) if cfg.rollout_refresh > 1 else None
    llm = LLM.from_model(
        snapshot or model, Tokenizer(out), path=out, role="orl", mode=cfg.rollout_mode
    )
    eager = None
    if cfg.check_replay and llm.mode != EAGER:
        eager = LLM.from_model(model, Tokenizer(out), path=out, role="orl", mode=EAGER)
    run = _Loop(cfg, out, model, optimizer, scheduler, replayer, llm, rank, world, eager, snapshot)
    if snapshot is not None:  # evaluations measure the trained weights, not the snapshot
        run.eval_llm = LLM.from_model(model, Tokenizer(out), path=out, role="orl", mode=EAGER)
    result = ORLResult(out, step)
    with (
        open(out / "log.jsonl", "a") if rank == 0 else open("/dev/null", "w") as log_file,
        StopFlag() as stop,
        VerifierPool(cfg.task, cfg.data, cfg.verifier_workers) as verifier,
    ):
        if ckpt is not None:
            log_file.write(json.dumps({"step": step, "event": "resume"}) + "\n")
        bar = progress_bar(cfg.steps, step, progress and rank == 0)
        bar.set_description("orl")
        step = run.loop(step, train_time, log_file, stop, ckpts, verifier, result, bar, on_step)
    result.step = step
    return result


@dataclass
class _Loop:
    cfg: ORLConfig
    out: Path
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    replayer: Replayer
    llm: LLM
    rank: int
    world: int
    eager: LLM | None = None  # the replay check's first rollout when `llm` runs graphs
    snapshot: torch.nn.Module | None = None  # rollout_refresh > 1: the rollouts' frozen weights
    eval_llm: LLM | None = None  # None: `llm` (it runs the trained weights)
    refreshed: bool = False  # the snapshot has been filled by this process

    def step(self, u: int, verifier: VerifierPool) -> dict[str, Any]:
        cfg, t0 = self.cfg, time.perf_counter()
        prompts = step_prompts(resolve_task(cfg.task, cfg.data), cfg, u)[self.rank :: self.world]
        self.model.eval()
        if self.snapshot is not None and (u % cfg.rollout_refresh == 0 or not self.refreshed):
            with torch.no_grad():  # in place: captured graphs keep pointing at these tensors
                for dst, src in zip(
                    self.snapshot.state_dict().values(), self.model.state_dict().values()
                ):
                    dst.copy_(src)
            self.refreshed = True
        tap = cfg.check_replay and self.rank == 0
        rollouts = generate_rollouts(self.llm, prompts, cfg, u, tap, self.eager)
        t_roll = time.perf_counter()
        verifier.verify(rollouts)
        entry: dict[str, Any] = {"step": u + 1}
        if tap and rollouts:
            entry["replay_max_abs_err"] = self.replayer.check(rollouts[0])
        self.model.train()
        probe = ResidualProbe(self.model.adapter, self.replayer.device)
        ops.use("torch")  # Triton kernels have no autograd: the replay runs the torch twins
        try:
            entry.update(self.replayer.losses(rollouts, probe))
        finally:
            ops.use(None)
        entry["optimizer_step"] = entry["responses"] > 0
        if entry["optimizer_step"]:
            entry["lr"] = self.scheduler.get_last_lr()[0]
            entry.update(optimizer_step(self.model, self.optimizer, self.scheduler, cfg, probe))
        else:
            self.optimizer.zero_grad(set_to_none=True)
            log.warning("step %d: no verified rollout, no optimizer step", u + 1)
        entry["rollout_s"] = round(t_roll - t0, 3)
        entry["step_s"] = round(time.perf_counter() - t0, 3)
        return entry

    def evaluate(self, u: int, write) -> None:
        cfg = self.cfg
        task = resolve_task(cfg.task, cfg.data)
        res = evaluate(
            self.eval_llm or self.llm,
            task,
            cfg.eval_problems,
            cfg.chat_fraction,
            max_new_tokens=cfg.max_new_tokens,
        )
        write({"step": u, "eval": res})

    def loop(self, u, train_time, log_file, stop, ckpts, verifier, result, bar, on_step) -> int:
        cfg = self.cfg

        def write(entry: dict[str, Any]) -> None:
            log_file.write(json.dumps(entry) + "\n")
            log_file.flush()

        while u < cfg.steps:
            t0 = time.perf_counter()
            entry = self.step(u, verifier)
            u += 1
            train_time += time.perf_counter() - t0
            entry["train_time_s"] = round(train_time, 3)
            write(entry)
            result.entries.append(entry)
            bar.set_postfix(reward=f"{entry['reward']:.2f}", loss=f"{entry['loss']:.4f}")
            bar.update()
            stopping = stop.set
            if cfg.eval_every and (u % cfg.eval_every == 0 or u == cfg.steps) and self.rank == 0:
                self.evaluate(u, write)
            if u % cfg.save_every == 0 or u == cfg.steps or stopping:
                if self.rank == 0:
                    state = {"train_time_s": train_time}
                    ckpts.save(u, self.model, self.optimizer, self.scheduler, state)
                dist.barrier()
            if stopping:
                result.interrupted = True
                break
            if on_step is not None:
                on_step(u)
        bar.close()
        return u
