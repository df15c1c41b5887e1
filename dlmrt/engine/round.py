"""The denoising round: one forward of the active block, the proposal, the rule, the next residual.

Takes and returns device tensors only (no host sync), so the graph modes can capture it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from dlmrt.attention import AttnContext
from dlmrt.decoding import DecodeRule, Proposal, propose
from dlmrt.models.residual import soft_embedding


class BlockState(NamedTuple):
    """State of the active block between rounds."""

    canvas: torch.Tensor  # [B] long
    unresolved: torch.Tensor  # [B] bool
    z: torch.Tensor | None  # [B, hidden] pre-adapter residual for the next round (None: Base model)
    step: torch.Tensor  # [] long, rounds run in this block
    done: torch.Tensor  # [] bool


@dataclass(frozen=True, slots=True)
class RoundSpec:
    """What stays fixed for a whole request: the model, the rule and the sampling temperature."""

    model: torch.nn.Module
    rule: DecodeRule
    temperature: float
    block_size: int
    generator: torch.Generator | None = None

    def residual_temperature(self) -> float | None:
        adapter = getattr(self.model, "adapter", None)
        return None if adapter is None else adapter.cfg.temperature

    def receives(self, unresolved: torch.Tensor) -> torch.Tensor:
        """Rows that get alpha * g(z): unresolved rows ("masked") or every row ("block")."""
        if self.model.adapter.cfg.positions == "block":
            return torch.ones_like(unresolved)
        return unresolved

    def noise(self, rows: int, device: torch.device) -> torch.Tensor | None:
        if self.temperature <= 0:
            return None
        return torch.rand(rows, generator=self.generator, device=device)

    def next_state(
        self, logits: torch.Tensor, state: BlockState
    ) -> tuple[BlockState, Proposal, torch.Tensor]:
        """Proposal + rule + next residual from this round's logits [B, V] (the last B rows)."""
        prop = propose(logits, self.temperature, self.noise(logits.shape[0], logits.device))
        out = self.rule(prop, state.canvas, state.unresolved, state.step)
        z = None
        t_res = self.residual_temperature()
        if t_res is not None:
            # Reuse the decoder's log-normaliser when both softmaxes use the same temperature.
            same = t_res == (self.temperature if self.temperature > 0 else 1.0)
            z = soft_embedding(logits, self.model.embed_table, t_res, prop.log_z if same else None)
        return (
            BlockState(out.canvas, out.unresolved, z, state.step + 1, out.done),
            prop,
            out.accepted,
        )


def initial_state(canvas: torch.Tensor, unresolved: torch.Tensor, spec: RoundSpec) -> BlockState:
    """A block before its first round: z = 0 (so g(z) = 0)."""
    z = None
    if getattr(spec.model, "adapter", None) is not None:
        z = torch.zeros(
            canvas.shape[0],
            spec.model.cfg.hidden_size,
            dtype=spec.model.embed_table.dtype,
            device=canvas.device,
        )
    zero = torch.zeros((), dtype=torch.long, device=canvas.device)
    return BlockState(canvas, unresolved, z, zero, zero.bool())


def denoise_round(
    spec: RoundSpec, state: BlockState, positions: torch.Tensor, kv, kv_len: int | None
) -> tuple[BlockState, Proposal, torch.Tensor]:
    """One round over the arena: returns (next state, this round's proposal, accepted rows)."""
    ctx = AttnContext(positions, spec.block_size, kv, kv_len)
    receives = spec.receives(state.unresolved) if state.z is not None else None
    logits = spec.model(state.canvas, ctx, z=state.z, receives=receives)
    return spec.next_state(logits, state)
