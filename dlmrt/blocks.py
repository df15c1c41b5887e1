"""Block layout of one request (SDAR semantics, `docs/block-layout.md`) and the stop rule.

Blocks sit on absolute multiples of the block length B. The floor(P / B) full prompt blocks are
prefilled; the prompt tail (P mod B tokens) starts the first decode block as already-resolved rows
that attend bidirectionally to the masks after them. The last block is decoded whole, rows past
prompt + max_new_tokens included, as the reference decoders (SDAR's, LLaDA2's `generate`) do: those
rows change what the other rows see, so leaving them masked would change the answer near the end.
The output is cut to max_new_tokens, and just after the first stop id within them.
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
    limit: int  # prompt + max_new_tokens: rows at or past it are decoded, then cut from the output

    @property
    def max_len(self) -> int:
        return self.num_blocks * self.block_length

    @property
    def tail(self) -> int:
        """Prompt tokens inside the first decode block."""
        return self.prompt_len - self.first_block * self.block_length


def room(max_positions: int, prompt_len: int, block_length: int) -> int:
    """The most new tokens whose whole blocks, after the prompt, fit `max_positions`."""
    return max_positions // block_length * block_length - prompt_len


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
