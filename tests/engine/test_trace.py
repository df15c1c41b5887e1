"""The device-side round trace: rows at the round counter, and safe past the cap (graph warm-up)."""

from __future__ import annotations

import torch

from dlmrt import LLM
from dlmrt.decoding import make_rule
from dlmrt.engine.block.round import RoundSpec


def test_trace_rows_follow_the_counter_and_clamp_past_the_cap(orl_ckpt):
    llm = LLM(orl_ckpt, device="cpu")
    engine, block = llm.engine, 8
    spec = RoundSpec(llm.model, make_rule("fixed_steps", denoising_steps=1), 0.0, block)
    with torch.inference_mode():
        prog = engine.program(spec, 4 * block, traced=True)
        cap = prog.rounds.cap
        assert prog.trace.canvas.shape == (cap, block)
        canvas = torch.full((block,), llm.mask_id)
        prog.buf.load(canvas, torch.ones(block, dtype=torch.bool), 0, 0)
        prog.kv_len = block
        for _ in range(cap + 2):  # as a graph warm-up may: the body run past the cap, no error
            prog.rounds.body()
        (record,) = prog.trace.records(0, 1)
        assert record.canvas_after.ne(llm.mask_id).all()  # the one fixed step fills the block
