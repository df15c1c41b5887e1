"""What a rollout leaves for training: its captured states (one per round) and its response.

`StateCapture` is the engine's recorder (`LLM.generate(recorder=...)`): it keeps each round's
canvas, unresolved rows, pre-adapter z (as consumed), per-row entropies and accepted rows. The
engine writes them into device buffers inside the round, in every mode, and hands them over after
each block (`dlmrt/engine/block/trace.py`): no host sync in the round. The capture is bounded per
step (`capture_limit`): one state past the bound is a clear error, never a silent drop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dlmrt.outputs import RoundRecord


@dataclass
class State:
    """Round k of block b of one rollout, as the engine ran it."""

    block: int
    round: int
    canvas: torch.Tensor  # [L] long: the canvas the round saw
    unresolved: torch.Tensor  # [L] bool: unresolved rows at the start of the round
    z: torch.Tensor | None  # [L, hidden]: the pre-adapter residual the round consumed
    entropy: torch.Tensor  # [L] float32 nats: this round's prediction (rollout temperature)
    accepted: torch.Tensor  # [L] bool: rows accepted this round
    logits: torch.Tensor | None = None  # [L, V]: the rollout's logits (only with --check-replay)

    @property
    def num_accepted(self) -> int:
        return int(self.accepted.sum())


@dataclass
class Rollout:
    """One sampled response of one prompt and its trajectory."""

    prompt_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    answer: int
    states: list[State]
    forwards: int
    verified: bool = False
    blocks: dict[int, list[State]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for s in self.states:  # records arrive in order: block by block, round by round
            self.blocks.setdefault(s.block, []).append(s)

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.token_ids


class CaptureLimitError(RuntimeError):
    pass


class StateCapture:
    """A recorder that appends each `RoundRecord` as a `State`, bounded by `limit` per step.

    With `logits_from` (a list the caller's lm_head hook appends to), each state also keeps the
    logits of the forward that produced it (the replay-exactness diagnostic)."""

    def __init__(self, limit: int, logits_from: list | None = None) -> None:
        self.limit, self.count = limit, 0
        self.states: list[State] = []
        self.logits_from = logits_from

    def start(self) -> None:
        """A new rollout: its states go to a new list (the bound counts the whole step)."""
        self.states = []

    def __call__(self, rec: RoundRecord) -> None:
        if self.count >= self.limit:
            raise CaptureLimitError(
                f"capture: more than capture_limit={self.limit} states in one step; raise "
                "--capture-limit or lower --rollouts-per-prompt / --max-new-tokens"
            )
        self.count += 1
        logits = self.logits_from.pop(0) if self.logits_from else None
        self.states.append(
            State(
                rec.block_index,
                rec.round,
                rec.canvas,
                rec.unresolved,
                rec.z,
                rec.entropy.float(),
                rec.accepted,
                logits,
            )
        )
