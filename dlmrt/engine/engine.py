"""Engine: the per-request block loop (eager mode).

prefill the full prompt blocks -> for each block: denoising rounds until the rule says done ->
commit pass (clean tokens, writes the block's KV) -> stop at a stop id or max_new_tokens.
The KV arena is allocated once per request; nothing is allocated per round beyond activations.
The engine knows nothing about text: it takes and returns token ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dlmrt.attention import AttnContext
from dlmrt.blocks import finish, initial_canvas, layout
from dlmrt.decoding import DecodeRule
from dlmrt.engine.kv_cache import KVCache
from dlmrt.engine.round import BlockState, RoundSpec, denoise_round, initial_state


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """What a round consumed and produced (for the trainer): device tensors, cloned."""

    block: int
    round: int
    canvas: torch.Tensor  # [B] canvas the round saw
    unresolved: torch.Tensor  # [B] unresolved rows at the start of the round
    z: torch.Tensor | None  # [B, hidden] pre-adapter residual the round consumed
    entropy: torch.Tensor  # [B] per-row entropy of this round's prediction
    accepted: torch.Tensor  # [B] rows accepted this round


@dataclass
class EngineResult:
    token_ids: list[int]
    finish_reason: str
    denoising_forwards: int = 0
    commit_forwards: int = 0
    prefill_forwards: int = 0
    rounds_per_block: list[int] = field(default_factory=list)


Recorder = Callable[[RoundRecord], None]
BlockCallback = Callable[[int, int, list[int]], None]  # (block index, rounds, tokens so far)


class Engine:
    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.cfg = model.cfg
        self.device = device
        self.dtype = dtype

    def generate(
        self,
        prompt_ids: list[int],
        *,
        rule: DecodeRule,
        block_size: int,
        max_new_tokens: int,
        mask_id: int,
        stop_ids: set[int],
        temperature: float = 0.0,
        seed: int = 0,
        ignore_eos: bool = False,
        recorder: Recorder | None = None,
        on_block: BlockCallback | None = None,
    ) -> EngineResult:
        lay = layout(len(prompt_ids), max_new_tokens, block_size)
        gen = torch.Generator(self.device).manual_seed(seed) if temperature > 0 else None
        spec = RoundSpec(self.model, rule, temperature, block_size, gen)
        kv = KVCache(
            self.cfg.num_hidden_layers,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
            lay.max_len,
            self.dtype,
            self.device,
        )
        res = EngineResult([], "length")
        with torch.inference_mode():
            if lay.first_block:
                self._clean_pass(prompt_ids[: lay.first_block * block_size], 0, block_size, kv)
                res.prefill_forwards = 1
            for b in range(lay.first_block, lay.num_blocks):
                state = self._denoise_block(spec, lay, b, prompt_ids, mask_id, kv, res, recorder)
                block_tokens = state.canvas.tolist()
                res.token_ids += block_tokens[lay.tail :] if b == lay.first_block else block_tokens
                res.token_ids, reason = finish(res.token_ids, stop_ids, max_new_tokens, ignore_eos)
                if on_block is not None:
                    on_block(b, res.rounds_per_block[-1], res.token_ids)
                if reason is not None:
                    res.finish_reason = reason
                    break  # the last block's commit pass is skipped: nothing reads its KV
                self._clean_pass(block_tokens, b * block_size, block_size, kv)
                res.commit_forwards += 1
        return res

    def _denoise_block(self, spec, lay, b, prompt_ids, mask_id, kv, res, recorder) -> BlockState:
        canvas, unresolved = initial_canvas(lay, b, prompt_ids, mask_id, self.device)
        state = initial_state(canvas, unresolved, spec)
        positions = torch.arange(b * lay.block, (b + 1) * lay.block, device=self.device)
        for r in range(lay.block):
            new, prop, accepted = denoise_round(spec, state, positions, kv, (b + 1) * lay.block)
            res.denoising_forwards += 1
            if recorder is not None:
                recorder(
                    RoundRecord(
                        b,
                        r,
                        state.canvas.clone(),
                        state.unresolved.clone(),
                        None if state.z is None else state.z.clone(),
                        prop.entropy.clone(),
                        accepted.clone(),
                    )
                )
            state = new
            if bool(state.done):  # eager mode: the host reads the flag each round
                res.rounds_per_block.append(r + 1)
                return state
        raise RuntimeError(
            f"block {b} did not finish in {lay.block} rounds (rule {spec.rule.name})"
        )

    def _clean_pass(self, tokens: list[int], start: int, block_size: int, kv: KVCache) -> None:
        """Prefill / commit: clean tokens (h = E[x]) write their K/V; no logits."""
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(tokens), device=self.device)
        self.model(
            ids, AttnContext(positions, block_size, kv, start + len(tokens)), compute_logits=False
        )
