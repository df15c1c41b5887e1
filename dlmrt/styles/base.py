"""What every decoding style offers `LLM`, and what it is built from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from dlmrt.config import EngineConfig
from dlmrt.loading.checkpoint import Checkpoint
from dlmrt.outputs import (
    CanvasRecorder,
    ProgressCallback,
    Recorder,
    RoundViewCallback,
    StopCheck,
    TokensCallback,
)
from dlmrt.params import DecodeParams


@dataclass(frozen=True)
class Setup:
    """The one parsed checkpoint and the engine settings a style is built from. A style reads the
    checkpoint's files through `checkpoint` (parsed once, by the loader), never from disk."""

    checkpoint: Checkpoint  # the model, its directory, config.json and generation_config.json
    tokenizer: Any  # dlmrt.tokenizer.Tokenizer
    config: EngineConfig
    mode: str  # the execution mode already agreed (`select_mode`, tensor-parallel ranks)
    device: torch.device
    dtype: torch.dtype
    stop_ids: set[int]
    default_rule: str  # the family's rule for the role asked for
    auto_rule: str  # the family's rule without a role
    tensor_parallel: bool

    @property
    def model(self) -> torch.nn.Module:
        return self.checkpoint.model

    @property
    def path(self) -> Path:
        """The checkpoint directory (the files errors name)."""
        return self.checkpoint.path


@dataclass(frozen=True)
class Hooks:
    """A request's callbacks (`LLM.generate` documents them)."""

    recorder: Recorder | CanvasRecorder | None = None
    on_progress: ProgressCallback | None = None
    should_stop: StopCheck | None = None
    on_tokens: TokensCallback | None = None
    on_view: RoundViewCallback | None = None  # drafts, live from the round stream (block style)


class Style(Protocol):
    engine: Any
    cfg: Any  # the model's parsed config (requests are checked against it)
    stop_ids: set[int]
    default_rule: str
    mask_id: int | None  # the block style's mask token (None: a canvas has its own)
    decoder: Any  # the block style's DecoderDefaults (None for canvases)
    canvas_settings: Any  # the encoder-decoder style's CanvasSettings (None for blocks)
    live_drafts: bool  # drafts come live from the round stream (else from the records)

    @classmethod
    def from_checkpoint(cls, setup: Setup) -> Style: ...

    def check(self, ids: list[int], params: DecodeParams) -> None:
        """ValueError naming what of the request this style cannot run."""

    def constraint(self, params: DecodeParams) -> Any:
        """The request's grammar state for its `response_format` (None: unconstrained); a
        ValueError naming what is wrong (the server's 400 before the request runs)."""

    def decoder_of(self, params: DecodeParams) -> dict[str, Any]:
        """The decoder a request runs: {"rule": its rule, each knob of this style's rules: the
        request's value, else the checkpoint's default, else dlmrt's}; None for a knob the rule
        settles when it runs (a block rule's `denoising_steps`: the block length). A request
        that sets nothing (`DecodeParams()`) gives the checkpoint's defaults."""

    def rows_needed(self, prompt_len: int, max_new_tokens: int, block_length: int | None) -> int:
        """Positions the request occupies: what must fit the model's context."""

    def room(self, prompt_len: int, block_length: int | None) -> int:
        """The most new tokens that fit the context after a prompt of `prompt_len`."""

    def generate(self, ids: list[int], params: DecodeParams, hooks: Hooks) -> Any:
        """Run the request; the engine's result (token ids, forwards, rounds)."""
