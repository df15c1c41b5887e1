"""Held-out evaluation with dlmrt's own engine and decoders: accuracy and tokens per forward.

`evaluate(llm, ...)` runs `llm.generate` on the first n test-split problems (each in chat or raw
format by its seed, as in training) and checks the text with the task's verifier. During
training, `live_llm` wraps the model being trained in an `LLM` (eager engine, no copy, no
reload), so the periodic evaluation runs exactly the code path of `dlmrt generate`.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from dlmrt.config import EAGER
from dlmrt.llm import LLM
from dlmrt.train.data import is_chat


def live_llm(model: torch.nn.Module, run_dir: Path, device: torch.device) -> LLM:
    """An `LLM` around a live model (its current weights, in their dtype) and `run_dir`'s tokenizer;
    the engine runs eagerly (no graphs: the weights change between calls)."""
    from dlmrt.tokenizer import Tokenizer

    return LLM.from_model(model, Tokenizer(run_dir), path=run_dir, mode=EAGER)


def evaluate(
    llm: LLM,
    task: ModuleType,
    num_problems: int,
    chat_fraction: float = 0.5,
    show_progress: bool = False,
    **params: Any,
) -> dict[str, Any]:
    """Accuracy and tokens per forward of `llm.generate(**params)` on held-out problems."""
    from tqdm import tqdm

    correct = tokens = forwards = 0
    t0 = time.perf_counter()
    was_training = llm.model.training
    llm.model.eval()
    try:
        problems = task.problems("test", num_problems)
        for p in tqdm(problems, desc="eval", leave=False, disable=not show_progress):
            out = llm.generate(p.question, chat=is_chat(p.seed, chat_fraction), **params)
            correct += task.verify(out.text, p.answer)
            tokens += len(out.token_ids)
            forwards += out.num_denoising_forwards
    finally:
        llm.model.train(was_training)
    return {
        "accuracy": correct / max(num_problems, 1),
        "tokens_per_forward": tokens / max(forwards, 1),  # all generated tokens / all forwards
        "problems": num_problems,
        "generated_tokens": tokens,
        "denoising_forwards": forwards,
        "seconds": round(time.perf_counter() - t0, 3),
        **{k: v for k, v in params.items() if v is not None},
    }
