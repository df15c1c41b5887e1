"""The oracle: block-diffusion generation with no KV cache, no graphs, no custom ops.

Every round recomputes the whole sequence (prompt + finished blocks + the active block) under a
dense block-causal mask. It shares only the model and the per-round decision (proposal, rule,
residual) with the engine; the engine must produce the same tokens (CPU, fp32). Slow by design.
"""

from __future__ import annotations

import torch

from dlmrt.attention import AttnContext
from dlmrt.blocks import finish, initial_canvas, layout
from dlmrt.decoding import DecodeRule
from dlmrt.engine.round import RoundSpec


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
    spec = RoundSpec(model, rule, temperature, block_size)
    seed_t = torch.tensor(seed, device=device)
    context = torch.tensor(
        prompt_ids[: lay.first_block * block_size], dtype=torch.long, device=device
    )
    generated: list[int] = []
    for b in range(lay.first_block, lay.num_blocks):
        canvas, unresolved = initial_canvas(lay, b, prompt_ids, mask_id, device)
        dtype = model.embed_table.dtype
        z = (
            torch.zeros(block_size, model.cfg.hidden_size, dtype=dtype, device=device)
            if spec.has_residual
            else None
        )
        start, step = torch.tensor(b * block_size, device=device), torch.tensor(0, device=device)
        positions = torch.arange((b + 1) * block_size, device=device)
        while unresolved.any():
            ids = torch.cat((context, canvas))
            receives = spec.receives(unresolved) if z is not None else None
            logits = model(ids, AttnContext(positions, block_size), z=z, receives=receives)
            d = spec.decide(logits[-block_size:], canvas, unresolved, step, seed_t, start)
            canvas, unresolved, z, step = d.out.canvas, d.out.unresolved, d.z, step + 1
        context = torch.cat((context, canvas))
        block = canvas.tolist()
        generated += block[lay.tail :] if b == lay.first_block else block
        generated, reason = finish(generated, stop_ids, max_new_tokens, ignore_eos)
        if reason is not None:
            return generated, reason
    raise AssertionError("unreachable: the last block always reaches max_new_tokens")
