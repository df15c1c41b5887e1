"""DiffusionGemma's canvas step for the round benchmark: ms per decoder step of one-canvas
requests, and the step's floor with the experts its routing touches."""

from __future__ import annotations

from dataclasses import replace

import torch

from benchmarks.common import wall_time
from benchmarks.moe_models import TouchedExperts, moe_round_floor
from dlmrt.engine import EncoderDecoderEngine


def time_canvas_mode(
    model, mode: str, context: int, iters: int, kv_dtype: str = "auto", steps: int = 20
) -> tuple[float, int]:
    """DiffusionGemma: (ms per decoder step, steps) from one-canvas requests of 4 and `steps`
    steps (never stopping early): the difference removes the prompt's encoder pass and host
    set-up."""
    from dlmrt.decoding.entropy_bound_canvas import CanvasSettings

    if steps <= 4:
        raise ValueError(f"steps: expected more than 4 (the shorter request's), got {steps}")
    engine = EncoderDecoderEngine(model, model.embed_table.device, mode, kv_dtype)
    prompt = torch.randint(0, model.cfg.vocab_size, (context,)).tolist()
    seconds = {}
    for n in (4, steps):
        s = replace(CanvasSettings(), max_denoising_steps=n, confidence_threshold=-1.0)

        def request(s: CanvasSettings = s) -> None:
            out = engine.generate(
                prompt, s, max_new_tokens=engine.canvas_length, stop_ids=[], ignore_eos=True
            )
            assert out.denoising_forwards == s.max_denoising_steps

        request()  # warm-up: graph capture for these settings
        seconds[n] = sorted(wall_time(request) for _ in range(iters))[iters // 2]
    return (seconds[steps] - seconds[4]) / (steps - 4) * 1e3, steps


def canvas_floor(model, context: int):
    """(FLOPs, bytes) of one decoder step over the 256-row canvas, experts counted from the
    routing of a one-step request (canvas passes only)."""
    from dlmrt.decoding.entropy_bound_canvas import CanvasSettings

    engine = EncoderDecoderEngine(model, model.embed_table.device, "eager")
    touched = TouchedExperts(model, rows=256)
    prompt = torch.randint(0, model.cfg.vocab_size, (context,)).tolist()
    s = replace(CanvasSettings(), max_denoising_steps=1)
    engine.generate(prompt, s, max_new_tokens=256, stop_ids=[], ignore_eos=True)
    touched.close()
    return touched, moe_round_floor(model, 256, context, touched)
