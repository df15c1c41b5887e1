"""Profile one eager denoising round at a full model shape: top CUDA kernels by total time.

python -m benchmarks.rounds.profile_round [--model qwen_dlm|llada2|diffusion_gemma] [--context 1024] [--rows 25]
    [--canvas masks|random] [--quantization none|fp8]

Also prints the number of kernel launches in the round (or DiffusionGemma step) and their total
GPU time, the launch count issue 37 asks to report per family.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.rounds.round_latency import _block, build
from dlmrt import account
from dlmrt.engine.block.round import RoundSpec, denoise_round


def canvas_step_fn(model, context: int):
    """One DiffusionGemma decoder step over static buffers after a `context`-token prompt."""
    from dataclasses import replace

    from dlmrt.decoding.entropy_bound_canvas import CanvasSettings
    from dlmrt.engine import EncoderDecoderEngine
    from dlmrt.engine.encoder_decoder.step import canvas_step, reset_canvas

    engine = EncoderDecoderEngine(model, model.embed_table.device, "eager")
    settings = replace(CanvasSettings(), max_denoising_steps=2)
    prompt = torch.randint(0, model.cfg.vocab_size, (context,)).tolist()
    engine.generate(prompt, settings, max_new_tokens=256, stop_ids=[], ignore_eos=True)
    prog = engine.program(settings, context + 2 * engine.canvas_length)

    def step() -> None:  # the first step of a fresh canvas (steps never pass the settings' cap)
        with torch.inference_mode():
            with account.label("reset_canvas", prog.buf.canvas):  # the setup, named in an account
                reset_canvas(prog.spec, prog.buf)
            canvas_step(prog.spec, prog.buf, prog.arena)

    return step


def round_fn(name: str, model, rule, context: int, canvas: str = "masks") -> Callable[[], None]:
    """One eager round of `name` after `context` prefilled tokens, to call repeatedly (each call
    one more round of the same block; DiffusionGemma: a fresh canvas's first step). QwenDLM runs
    its ORL rule (`entropy_budget`)."""
    if name == "diffusion_gemma":
        return canvas_step_fn(model, context)
    if name == "qwen_dlm":
        from dlmrt.decoding import make_rule

        rule = make_rule("entropy_budget")
    spec = RoundSpec(model, rule, 0.0, model.cfg.block_size)
    with torch.inference_mode():
        _, prog, start = _block(model, "eager", context, rule, canvas)
        start()

    def one_round() -> None:
        with torch.inference_mode():
            denoise_round(spec, prog.buf, prog.kv)

    return one_round


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", choices=["qwen_dlm", "llada2", "diffusion_gemma"], default="qwen_dlm"
    )
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--canvas", choices=["masks", "random"], default="masks")
    ap.add_argument("--quantization", choices=["none", "fp8"], default="none")
    args = ap.parse_args()
    model, rule, _, _ = build(args.model, None)
    if args.quantization == "fp8":
        quantize_fp8(model)
    step = round_fn(args.model, model, rule, args.context, args.canvas)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    report(prof, args.rows)


def quantize_fp8(model) -> None:
    """`fp8_model.quantize`, logging which linears run FP8 and why."""
    import logging

    from benchmarks import fp8_model

    logging.basicConfig(format="%(message)s")
    logging.getLogger("dlmrt").setLevel(logging.INFO)
    fp8_model.quantize(model)


def report(prof, rows: int) -> None:
    """The top kernels by GPU time, then the launch count and their summed GPU time."""
    events = prof.key_averages()
    print(events.table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70))
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    launches = sum(e.count for e in kernels)
    gpu_us = sum(e.self_device_time_total for e in kernels)
    print(f"kernel launches per round: {launches}; their GPU time: {gpu_us / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
