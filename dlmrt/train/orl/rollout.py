"""Rollouts with the current weights, and the verifier pool.

`LLM.from_model` wraps the model being trained (the same object: no weight copy, no sync, so the
rollouts are on-policy by construction). Every rollout's sampling seed is a pure function of
(run seed, step, prompt, rollout), so a resumed run draws the same rollouts. The verifier runs
in a process pool (`VerifierPool`), off the trainer's path.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from dlmrt.llm import LLM
from dlmrt.request_checks import prompt_ids
from dlmrt.train.data import is_chat
from dlmrt.train.orl.capture import Rollout, StateCapture
from dlmrt.train.orl.config import DECODER_KNOBS, ORLConfig
from dlmrt.train.stop_flag import helper_init


@dataclass(frozen=True, slots=True)
class Prompt:
    index: int  # global prompt number (step * B + j)
    question: str
    chat: bool
    answer: Any  # the task's gold answer (what its verifier takes)


def step_prompts(task, cfg: ORLConfig, step: int) -> list[Prompt]:
    """The B prompts of `step` (train split, in seed order: prompt n is the n-th train problem)."""
    it = task.iter_split("train", 0)
    first = step * cfg.prompts_per_step
    out = []
    for n, p in enumerate(it):
        if n >= first + cfg.prompts_per_step:
            break
        if n >= first:
            out.append(Prompt(n, p.question, is_chat(p.seed, cfg.chat_fraction), p.answer))
    return out


def rollout_seed(seed: int, step: int, prompt: int, g: int) -> int:
    digest = hashlib.sha256(f"orl:{seed}:{step}:{prompt}:{g}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def decode_params(cfg: ORLConfig) -> dict:
    params = {"rule": cfg.rule, **{k: getattr(cfg, k) for k in DECODER_KNOBS}}
    return {k: v for k, v in params.items() if v is not None}


class LogitsTap:
    """A forward hook on lm_head keeping every forward's logits, in order (the replay check's
    reference; eager mode only: a captured graph runs no hooks). Each round runs the head once
    (prefill and commit passes compute no logits), so the i-th logits belong to the i-th record,
    even though records arrive after their block."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.logits: list[torch.Tensor] = []
        self.handle = model.lm_head.register_forward_hook(self._hook)

    def _hook(self, module, args, out) -> None:
        self.logits.append(out.detach().clone())

    def close(self) -> None:
        self.handle.remove()


def generate_rollouts(
    llm: LLM,
    prompts: list[Prompt],
    cfg: ORLConfig,
    step: int,
    tap_first: bool = False,
    eager: LLM | None = None,
) -> list[Rollout]:
    """G rollouts of each prompt, their states captured (bounded per step: `capture_limit`).

    tap_first: the first rollout also keeps its logits (the replay check), run by `eager` (an
    eager `LLM` on the same model; default `llm`): hooks do not run in a captured graph, and on
    CUDA every mode runs the same kernels, so its tokens are those `llm` would draw."""
    tap = LogitsTap(llm.model) if tap_first else None
    capture = StateCapture(cfg.capture_limit, tap.logits if tap else None)
    rollouts = []
    try:
        for p in prompts:
            for g in range(cfg.rollouts_per_prompt):
                capture.start()
                run = eager if tap is not None and eager is not None else llm
                out = run.generate(
                    p.question,
                    chat=p.chat,
                    recorder=capture,
                    temperature=cfg.temperature,
                    seed=rollout_seed(cfg.seed, step, p.index, g),
                    max_new_tokens=cfg.max_new_tokens,
                    **decode_params(cfg),
                )
                ids = prompt_ids(llm.tokenizer, p.question, p.chat, llm.model_config.vocab_size)
                rollouts.append(
                    Rollout(
                        p.index,
                        ids,
                        out.token_ids,
                        out.text,
                        p.answer,
                        capture.states,
                        out.num_denoising_forwards,
                    )
                )
                if tap is not None:  # the first rollout only
                    tap.close()
                    tap, capture.logits_from = None, None
    finally:
        if tap is not None:
            tap.close()
    return rollouts


def _verify(task: str, data: str | None, text: str, answer) -> bool:
    from dlmrt.train.orl.tasks import resolve_task

    return bool(resolve_task(task, data).verify(text, answer))


class VerifierPool:
    """The task's verifier in `workers` spawned processes (0: in this process)."""

    def __init__(self, task: str, data: str | None, workers: int) -> None:
        self.task, self.data = task, data
        self.pool = None
        if workers > 0:
            ctx = multiprocessing.get_context("spawn")
            # The workers ignore the stop signals: a SIGTERM sent to the process group (`timeout`)
            # must not break the pool under the step that the trainer finishes before it saves;
            # and they die with the trainer (a `kill -9` of it leaves no worker behind).
            self.pool = ProcessPoolExecutor(
                workers, mp_context=ctx, initializer=helper_init, initargs=(os.getpid(),)
            )

    def verify(self, rollouts: list[Rollout]) -> None:
        """Set each rollout's `verified` flag."""
        if self.pool is None:
            results = [_verify(self.task, self.data, r.text, r.answer) for r in rollouts]
        else:
            futures = [
                self.pool.submit(_verify, self.task, self.data, r.text, r.answer) for r in rollouts
            ]
            results = [f.result() for f in futures]
        for r, ok in zip(rollouts, results):
            r.verified = ok

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
