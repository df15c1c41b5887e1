"""The oracle: block-diffusion generation with no KV cache, no graphs, no custom ops.

Every round recomputes the whole sequence (prompt + finished blocks + the active block) under a
dense block-causal mask. It shares only the model, the proposal and the rules with the engine; the
engine must produce the same tokens (CPU, fp32). Slow by design: it is the spec.
"""

from __future__ import annotations

import torch

from dlmrt.attention import AttnContext
from dlmrt.blocks import finish, initial_canvas, layout
from dlmrt.decoding import DecodeRule
from dlmrt.engine.round import RoundSpec, initial_state


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
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
) -> tuple[list[int], str]:
    """Return (generated token ids, finish reason) exactly as `Engine.generate` should."""
    device = model.embed_table.device
    lay = layout(len(prompt_ids), max_new_tokens, block_size)
    gen = torch.Generator(device).manual_seed(seed) if temperature > 0 else None
    spec = RoundSpec(model, rule, temperature, block_size, gen)
    context = torch.tensor(
        prompt_ids[: lay.first_block * block_size], dtype=torch.long, device=device
    )
    generated: list[int] = []
    for b in range(lay.first_block, lay.num_blocks):
        canvas, unresolved = initial_canvas(lay, b, prompt_ids, mask_id, device)
        state = initial_state(canvas, unresolved, spec)
        positions = torch.arange((b + 1) * block_size, device=device)
        while not bool(state.done):
            ids = torch.cat((context, state.canvas))
            receives = spec.receives(state.unresolved) if state.z is not None else None
            logits = model(ids, AttnContext(positions, block_size), z=state.z, receives=receives)
            state, _, _ = spec.next_state(logits[-block_size:], state)
        context = torch.cat((context, state.canvas))
        block = state.canvas.tolist()
        generated += block[lay.tail :] if b == lay.first_block else block
        generated, reason = finish(generated, stop_ids, max_new_tokens, ignore_eos)
        if reason is not None:
            return generated, reason
    raise AssertionError("unreachable: the last block always reaches max_new_tokens")
