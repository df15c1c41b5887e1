"""The oracle: block-diffusion generation with no KV cache, no graphs, no custom ops.

Every round recomputes the whole sequence (prompt + finished blocks + the active block) under a
dense block-causal mask, and computes the residual z and its rows m inline from its definition (`dlmrt/models/residual.py`). It
shares with the engine the model, the block layout, the proposal and the rules (each tested on its
own); the engine must produce the same tokens (CPU, fp32). Slow by design: it is the spec.
With an editing rule (`llada_editing`) a block's tokens may change after they were filled; the
next block always sees the block's final tokens (the whole prefix is recomputed each round).
"""

from __future__ import annotations

import functools

import torch

from dlmrt.attention import AttnContext
from dlmrt.blocks import finish, initial_canvas, layout
from dlmrt.decoding import DecodeRule, propose
from dlmrt.decoding.noise import counter_uniform


def _residual(model, logits: torch.Tensor) -> torch.Tensor:
    """z = softmax(logits / T_res) @ E, straight as the ORL paper writes it (no shared log-normaliser)."""
    p = torch.softmax(logits.float() / model.adapter.cfg.temperature, dim=-1)
    return (p.to(model.embed_table.dtype) @ model.embed_table).to(model.embed_table.dtype)


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
    prompt_ids: list[int],
    *,
    rule: DecodeRule,
    block_length: int,
    max_new_tokens: int,
    mask_id: int,
    stop_ids: set[int],
    temperature: float = 0.0,
    seed: int = 0,
    ignore_eos: bool = False,
) -> tuple[list[int], str]:
    """Return (generated token ids, finish reason) exactly as `BlockEngine.generate` should."""
    device = model.embed_table.device
    lay = layout(len(prompt_ids), max_new_tokens, block_length)
    context = torch.tensor(
        prompt_ids[: lay.first_block * block_length], dtype=torch.long, device=device
    )
    generated: list[int] = []
    for b in range(lay.first_block, lay.num_blocks):
        canvas, unresolved = initial_canvas(lay, b, prompt_ids, mask_id, device)
        canvas = _decode_block(model, context, canvas, unresolved, b, rule, temperature, seed)
        context = torch.cat((context, canvas))
        block = canvas.tolist()
        generated += block[lay.tail :] if b == lay.first_block else block
        generated, reason = finish(generated, stop_ids, max_new_tokens, ignore_eos)
        if reason is not None:
            return generated, reason
    raise AssertionError("unreachable: the last block always reaches max_new_tokens")


def _decode_block(model, context, canvas, unresolved, index: int, rule, temperature, seed):
    """Rounds of block `index` until the rule says done; -> its final canvas."""
    device, rows = canvas.device, canvas.shape[0]
    adapter = getattr(model, "adapter", None)
    # z = 0 on a block's first round: g(0) = 0, but the post-norm still applies (`inject`).
    z = None if adapter is None else torch.zeros_like(model.embed_table[:rows])
    ctx = AttnContext(torch.arange(context.shape[0] + rows, device=device), rows)
    # Editing rules may rewrite the rows this request generates (never the prompt tail).
    editable, post_steps = unresolved.clone(), torch.zeros((), dtype=torch.long, device=device)
    for step in range(rule.max_rounds(rows)):
        ids = torch.cat((context, canvas))
        if adapter is None:
            logits = model(ids, ctx)
        else:
            logits = model(ids, ctx, z=z, receives=adapter.receives(unresolved))
        logits = logits[-rows:]
        noise = None
        if temperature > 0:
            t = functools.partial(torch.tensor, device=device)
            noise = counter_uniform(t(seed), t(index * rows), t(step), rows)
        prop = propose(logits, temperature, noise)
        out = rule(prop, canvas, unresolved, torch.tensor(step), editable, post_steps)
        canvas, unresolved = out.canvas, out.unresolved
        if out.post_steps is not None:
            post_steps = out.post_steps
        z = _residual(model, logits) if adapter is not None else None
        if bool(out.done):
            return canvas
    raise RuntimeError(f"oracle: block {index} did not finish in {rule.max_rounds(rows)} rounds")
