"""Block layout of one request (SDAR semantics, `docs/block-layout.md`) and the stop rule.

Blocks sit on absolute multiples of the block length B. The floor(P / B) full prompt blocks are
prefilled; the prompt tail (P mod B tokens) starts the first decode block as already-resolved rows
that attend bidirectionally to the masks after them. Rows past prompt + max_new_tokens (in the last
block) stay mask tokens and are never decoded, so no round is spent on tokens nobody asked for.
The output is cut just after the first stop id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Layout:
    prompt_len: int
    block_length: int  # B
    num_blocks: int  # blocks covering prompt + max_new_tokens
    first_block: int  # index of the first decode block (= number of full prompt blocks)
    limit: int  # prompt + max_new_tokens: rows at or past this position are not decoded

    @property
    def max_len(self) -> int:
        return self.num_blocks * self.block_length

    @property
    def tail(self) -> int:
        """Prompt tokens inside the first decode block."""
        return self.prompt_len - self.first_block * self.block_length


def layout(prompt_len: int, max_new_tokens: int, block_length: int) -> Layout:
    num_blocks = -(-(prompt_len + max_new_tokens) // block_length)
    first = prompt_len // block_length
    return Layout(prompt_len, block_length, num_blocks, first, prompt_len + max_new_tokens)


def initial_canvas(
    lay: Layout, index: int, prompt_ids: list[int], mask_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Canvas [B] and unresolved mask [B] of decode block `index` before its first round."""
    canvas = torch.full((lay.block_length,), mask_id, dtype=torch.long, device=device)
    unresolved = torch.ones(lay.block_length, dtype=torch.bool, device=device)
    if index == lay.first_block and lay.tail:
        tail = prompt_ids[lay.first_block * lay.block_length :]
        canvas[: lay.tail] = torch.tensor(tail, device=device)
        unresolved[: lay.tail] = False
    past = lay.limit - index * lay.block_length  # first row past the limit, if in this block
    if past < lay.block_length:
        unresolved[past:] = False
    return canvas, unresolved


def finish(
    generated: list[int], stop_ids: set[int], max_new_tokens: int, ignore_eos: bool
) -> tuple[list[int], str | None]:
    """Cut the generated tokens after a stop id or at the length limit; reason None = keep going."""
    if not ignore_eos:
        for i, t in enumerate(generated[:max_new_tokens]):
            if t in stop_ids:
                return generated[: i + 1], "stop"
    if len(generated) >= max_new_tokens:
        return generated[:max_new_tokens], "length"
    return generated, None
