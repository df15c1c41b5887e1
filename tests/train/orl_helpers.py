"""Shared pieces of the ORL tests: a tiny trainable ORL model and its captured rollouts."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import residual_config, write_checkpoint

from dlmrt.llm import LLM
from dlmrt.tokenizer import Tokenizer
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.rollout import Prompt, generate_rollouts
from dlmrt.train.orl.start import load_trainable


def tiny_orl(tmp_path: Path, positions: str = "masked", seed: int = 0):
    """(model, LLM around it, checkpoint path): fp32, CPU, block 8, an adapter on `positions`."""
    path = write_checkpoint(
        tmp_path / f"orl-{positions}", seed=seed, residual=residual_config(positions=positions)
    )
    raw = json.loads((path / "config.json").read_text())
    model = load_trainable(path, raw, torch.device("cpu"), seed)
    llm = LLM.from_model(model, Tokenizer(path), path=path, role="orl", mode="eager")
    return model, llm, path


PROMPTS = [Prompt(0, "What is 12 + 3?", False, 15), Prompt(1, "Compute 7 * 8 now, ok", False, 56)]


def rollouts(llm, path: Path, n: int = 2, tap_first: bool = True, tokens: int = 20, **kw):
    """`n` sampled rollouts per prompt (13 and 21 prompt bytes: neither a block multiple)."""
    cfg = ORLConfig(
        model=str(path),
        rollouts_per_prompt=n,
        max_new_tokens=tokens,
        temperature=1.0,
        verifier_workers=0,
        **kw,
    )
    rs = generate_rollouts(llm, PROMPTS, cfg, step=0, tap_first=tap_first)
    for r in rs:
        r.verified = True
    return rs


def crafted_rollout(prompt_len: int, n_tokens: int, block: int, rounds: list[int], hidden=4):
    """A Rollout without a model: decode block b ran rounds[b - first] rounds; round k of a block
    has rows k.. unresolved and accepts one row (entropy 0.5 nats on every row)."""
    from dlmrt.train.orl.capture import Rollout, State

    first = prompt_len // block
    states = []
    for i, n in enumerate(rounds):
        b = first + i
        for k in range(n):
            unres = torch.zeros(block, dtype=torch.bool)
            unres[min(k, block - 1) :] = True
            acc = torch.zeros(block, dtype=torch.bool)
            acc[min(k, block - 1)] = True
            states.append(
                State(
                    b,
                    k,
                    torch.arange(block) + 10 * b + k,
                    unres,
                    torch.full((block, hidden), float(k)),
                    torch.full((block,), 0.5),
                    acc,
                )
            )
    prompt = list(range(100, 100 + prompt_len))
    return Rollout(0, prompt, list(range(200, 200 + n_tokens)), "", 0, states, len(states), True)
