"""What a request returns (`GenerationOutput`, `EngineResult`), what a round (block style) or a
denoising step (encoder-decoder style) records, and the callback types of the engines and `LLM`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dlmrt.config import EAGER

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class GenerationOutput:
    """Result of one request.

    tokens_per_forward (TPF) = generated tokens / denoising forwards, the paper's definition (commit
    and encoder passes are not charged; `num_commit_forwards` counts them). With commit folding (the
    default) a joint pass counts as one denoising forward: folding a plain commit leaves TPF as it
    was (the saving shows as num_commit_forwards == 0 and in request_tps); folding an editing
    rule's post-fill check (one forward instead of two) raises it. A limit that ends inside the last
    block decodes the whole block and counts only the tokens kept (`docs/block-layout.md`), so a
    short request on a slow model can show TPF < 1.
    request_time_s covers tokenisation, prefill, decoding and host overhead (not model loading);
    request_tps = generated tokens / request_time_s. num_cached_tokens: prompt tokens not
    prefilled because the arena held their K/V from earlier requests (`docs/prefix-reuse.md`).
    """

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (a stop id was generated; kept as the last token) or "length"
    prompt_tokens: int
    num_denoising_forwards: int
    num_commit_forwards: int
    num_prefill_forwards: int
    request_time_s: float
    rounds_per_block: list[int] = field(default_factory=list)
    mode: str = EAGER  # execution mode that ran the request
    num_cached_tokens: int = 0  # prompt tokens an earlier request's K/V served (prefix reuse)

    @classmethod
    def of(cls, text: str, prompt_tokens: int, res: EngineResult, t0: float) -> GenerationOutput:
        """The output of an engine's `res` for a request that started at perf_counter() `t0`."""
        return cls(
            text,
            res.token_ids,
            res.finish_reason,
            prompt_tokens,
            res.denoising_forwards,
            res.commit_forwards,
            res.prefill_forwards,
            time.perf_counter() - t0,
            res.rounds_per_block,
            mode=res.mode,
            num_cached_tokens=res.cached_tokens,
        )

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_forward(self) -> float:
        return len(self.token_ids) / max(self.num_denoising_forwards, 1)

    @property
    def request_tps(self) -> float:
        return len(self.token_ids) / self.request_time_s if self.request_time_s > 0 else 0.0

    @property
    def ms_per_round(self) -> float:
        """request_time_s per denoising forward, in ms (prefill and host time included)."""
        return self.request_time_s * 1e3 / max(self.num_denoising_forwards, 1)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """What a block-style round consumed and produced (the trainer, the drafts): device tensors.

    Copied out of the engine's device-side trace after the block (`engine/block/trace.py`), in
    every mode. They are created under `torch.inference_mode()`: clone them outside it (or use
    them as constants, e.g. the stop-gradient z of replay) before they enter an autograd graph.
    """

    block_index: int
    round: int
    canvas: torch.Tensor  # [B] canvas the round saw
    unresolved: torch.Tensor  # [B] unresolved rows at the start of the round
    z: torch.Tensor | None  # [B, hidden] pre-adapter residual the round consumed
    entropy: torch.Tensor  # [B] per-row entropy of this round's prediction
    accepted: torch.Tensor  # [B] rows accepted this round
    edited: torch.Tensor | None = None  # [B] resolved rows rewritten this round (editing rules)
    proposal: torch.Tensor | None = None  # [B] this round's candidate token per row (argmax/sample)
    confidence: torch.Tensor | None = None  # [B] fp32 probability of `proposal`
    canvas_after: torch.Tensor | None = None  # [B] the canvas after the round's decision


@dataclass
class EngineResult:
    """What an engine returns for one request: token ids, never text (`LLM` decodes them)."""

    token_ids: list[int]
    finish_reason: str
    denoising_forwards: int = 0
    commit_forwards: int = 0
    prefill_forwards: int = 0
    rounds_per_block: list[int] = field(default_factory=list)
    mode: str = EAGER
    cached_tokens: int = 0  # prompt rows reused from the arena, not prefilled (prefix reuse)
    forced_tokens: int = 0  # structured output: tokens the grammar committed without a forward
    grammar_ms: float = 0.0  # structured output: host time in the grammar


@dataclass(frozen=True, slots=True)
class CanvasStepRecord:
    """What one denoising step of a canvas (encoder-decoder style, DiffusionGemma) produced: device
    tensors, cloned.

    The engine writes them into device-side history buffers inside the (captured) step and hands
    them over after the canvas, so recording never adds a host sync inside a canvas."""

    canvas_index: int
    step: int  # steps already taken in this canvas (0 for its first)
    argmax: torch.Tensor  # [L] long: the step's argmax (the canvas's output, its last step)
    confidence: torch.Tensor  # [L] float32: the argmax's probability (at the step's temperature)
    accepted: torch.Tensor  # [L] bool: rows whose sample is kept (the others are re-noised)


Recorder = Callable[[RoundRecord], None]
CanvasRecorder = Callable[[CanvasStepRecord], None]
# (block or canvas index, rounds it took, tokens so far)
ProgressCallback = Callable[[int, int, list[int]], None]
# the request's final tokens so far, each time they grow (`engine/block/token_feed.py`)
TokensCallback = Callable[[list[int]], None]


@dataclass(frozen=True, slots=True)
class RoundView:
    """One round of a block as the round stream shows it (`engine/block/row_stream.py`): per row
    of the block the token shown (its token, or the proposal while masked), its state (0 final
    before this round, 1 accepted or edited this round, 2 still masked) and the probability of
    the token shown (1.0 for final rows). `first`: the block's first generated row."""

    block_index: int
    round: int  # rounds run in this block so far (from 1)
    first: int
    tokens: list[int]
    states: list[int]
    confidence: list[float]


RoundViewCallback = Callable[[RoundView], None]
StopCheck = Callable[[], bool]  # polled between rounds (host loops) or blocks (block_graph)
