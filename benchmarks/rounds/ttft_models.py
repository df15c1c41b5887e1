"""The time-to-first-token benchmark's models (`ttft.py`): each family's full-size config (or a
tiny one, `--tiny`) with random weights, wrapped in an `LLM` with prefix reuse on or off, and
the request each turn sends (random token ids, a forced number of rounds, ignore_eos).

No tokenizer: the prompts are token ids and the answers are never read as text, so the `LLM`
holds `IdsOnly`, which declares no stop ids and decodes every answer to "".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks.common import random_model
from dlmrt import LLM
from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini, qwen_dlm_4b
from dlmrt.models.diffusion_gemma_config import FULL, SLIDING
from dlmrt.models.qwen_dlm import QwenDLM

MODELS = ("qwen_dlm", "llada2", "diffusion_gemma")
# Forced rounds per block (DiffusionGemma: denoising steps per canvas), so every run does the
# same work: QwenDLM 23 (the other round benchmarks' realistic TPF of ~11), LLaDA2 32 (its
# editing rule on random weights fills one row per round), DiffusionGemma 20 (canvas_step.py).
ROUNDS = {"qwen_dlm": 23, "llada2": 32, "diffusion_gemma": 20}
TINY_ROUNDS = {"qwen_dlm": 4, "llada2": 2, "diffusion_gemma": 4}
TINY_VOCAB = 300
# The directory the `LLM` says it came from: none exists, so no config file applies (its
# generation_config.json would set decoder defaults; every request here sets its own).
NO_FILES = Path("random-weights")


class IdsOnly:
    """The tokenizer an `LLM` around a random model needs: no stop ids, no text."""

    declared_stop_ids: frozenset[int] = frozenset()
    stop_ids: frozenset[int] = frozenset()
    mask_token_id = None
    chat_template = None

    def decode(self, ids: list[int]) -> str:
        return ""


def stream_option(stream: str) -> tuple[dict, str]:
    """(keyword arguments for `LLM.from_model`, what the result records) for `--stream on|off`:
    tokens every round (also out of the block graph) or once per block (`docs/streaming.md`)."""
    if stream not in ("on", "off"):
        raise ValueError(f"--stream: expected 'on' or 'off', got {stream!r}")
    return {"stream_rounds": stream == "on"}, stream


@dataclass(frozen=True)
class Bench:
    """A built model, its family's name and the rounds each block (canvas) is forced to."""

    name: str
    model: torch.nn.Module
    rounds: int

    @property
    def vocab(self) -> int:
        return self.model.cfg.vocab_size

    def shape(self) -> dict:
        """What the result file records of the model."""
        cfg = self.model.cfg
        rows = getattr(cfg, "block_size", None) or cfg.canvas_length
        return {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": self.vocab,
                "rows": rows, "rounds": self.rounds}  # fmt: skip

    def request(self, max_new_tokens: int) -> dict:
        """The keyword arguments of every turn's `generate`: a forced number of rounds, no stop
        (ignore_eos), greedy; DiffusionGemma with counter noise (the engine's own path, where
        prefix reuse runs) and no early stop (a canvas stops early once its mean entropy is below
        confidence_threshold: never below 0)."""
        kw = dict(max_new_tokens=max_new_tokens, ignore_eos=True, temperature=0.0)
        if self.name == "diffusion_gemma":
            return kw | dict(
                max_denoising_steps=self.rounds, confidence_threshold=0.0, rng="counter"
            )
        return kw | dict(rule="fixed_steps", denoising_steps=self.rounds)


def full_config(name: str, layers: int | None):
    """The family's full-size config (`dlmrt/model_shapes.py`), `layers` of them if given."""
    shapes = {
        "qwen_dlm": qwen_dlm_4b,
        "llada2": llada21_mini,
        "diffusion_gemma": diffusion_gemma_26b,
    }
    return shapes[name]() if layers is None else shapes[name](layers)


def tiny_config(name: str):
    """The family's config at tiny widths (a CPU smoke test in seconds): its layer pattern and
    code paths (DiffusionGemma: one sliding and one full layer), 8-row blocks (LLaDA2: 4), a
    vocabulary of `TINY_VOCAB`."""
    small = dict(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=48)
    if name == "qwen_dlm":
        cfg = qwen_dlm_4b(2)
        return replace(cfg, **small, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       max_position_embeddings=4096, mask_token_id=TINY_VOCAB - 1, block_size=8,
                       residual=replace(cfg.residual, intermediate_size=48))  # fmt: skip
    if name == "llada2":
        return replace(llada21_mini(2), **small, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=16, rotary_dim=8, num_experts=16, n_group=4, topk_group=2, top_k=3,
                       moe_intermediate_size=8, max_position_embeddings=4096,
                       mask_token_id=TINY_VOCAB - 1, block_size=4)  # fmt: skip
    types = (SLIDING, FULL)  # one layer of each kind
    return replace(diffusion_gemma_26b(), **small, self_conditioning_size=48, layer_types=types,
                   num_attention_heads=2, head_dims=tuple(32 if t == FULL else 16 for t in types),
                   kv_heads=tuple(1 if t == FULL else 2 for t in types),
                   sliding_window=16, num_experts=4, top_k_experts=2, moe_intermediate_size=8,
                   max_position_embeddings=4096, canvas_length=8, eos_token_ids=(1,))  # fmt: skip


def build(name: str, device: torch.device, tiny: bool, layers: int | None = None) -> Bench:
    """The family's random-weight model (seeded: the same weights every run): bf16 at full size
    on CUDA, float32 when tiny or on the CPU."""
    if name not in MODELS:
        raise ValueError(f"--model: expected one of {', '.join(MODELS)}, got {name!r}")
    cfg = tiny_config(name) if tiny else full_config(name, layers)
    cls = QwenDLM
    if name == "llada2":
        from dlmrt.models.llada2 import LLaDA2 as cls
    elif name == "diffusion_gemma":
        from dlmrt.models.diffusion_gemma import DiffusionGemma as cls
    dtype = torch.float32 if tiny or device.type == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    model = random_model(cfg, device, dtype, cls=cls)
    return Bench(name, model, (TINY_ROUNDS if tiny else ROUNDS)[name])


def make_llm(bench: Bench, mode: str, prefix_reuse: bool, stream_kwargs: dict) -> LLM:
    """An `LLM` around the benchmark's model (each one its own engine, arena and graphs)."""
    if NO_FILES.exists():
        raise RuntimeError(
            f"{NO_FILES.resolve()}: expected no such path (config files would apply)"
        )
    return LLM.from_model(
        bench.model, IdsOnly(), path=NO_FILES, mode=mode, prefix_reuse=prefix_reuse, **stream_kwargs
    )
