"""One denoising round at a full model shape (random bf16 weights) in each execution mode.

    python -m benchmarks.rounds.round_latency [--model qwen_dlm|llada2] [--contexts 1024 4096]
        [--quantization fp8|nvfp4] [--kv-cache-dtype fp8] [--out benchmarks/results/round_latency.json]

qwen_dlm: QwenDLM-4B + ORL adapter, 256 rows; a block is forced to 23 rounds (`fixed_steps`).
llada2: LLaDA-2.1-mini (`dlmrt/model_shapes.py`), 32 rows, its `llada_editing` rule (quality preset;
random weights fill about one row per round). diffusion_gemma: DiffusionGemma-26B-A4B, one
256-row canvas decoder step (entropy_bound_canvas, counter RNG), ms/step from requests of 4 and
20 steps (their difference: no prompt encoding in it). ms/round = block time / rounds, so the graph modes
include their per-round host work (round_graph: one replay + one `done` read per round;
block_graph: one launch per block). Also: the QwenDLM round's dense GEMMs alone (graph-replayed),
and the roofline floor max(FLOPs / 790 TFLOP/s, bytes / the device's copy bandwidth: 3.0 TB/s on an H100, 4.3 on an H200); for MoE the bytes count only
the experts the round's routing touches (counted from one round's routing). With
--quantization fp8 the FP8 floor too (`fp8_model.py`: FP8 weights at 1 byte, FP8 GEMMs at 1,580
TFLOP/s) and the ratio to it; --quantization nvfp4 installs NVFP4 routed experts (W4A16 kernel,
`fp8_model.quantize_nvfp4`) and `fp8_floor_ms` is then their floor (0.5625 bytes a weight).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import fp8_model
from benchmarks.common import (
    PEAK_BYTES,
    PEAK_FLOPS,
    command_line,
    cuda_time,
    gemm_only_ms,
    random_model,
    round_flops_bytes,
    write_result,
)
from benchmarks.moe_models import TouchedExperts, moe_round_floor, route_to_first
from benchmarks.rounds.canvas_step import canvas_floor, time_canvas_mode
from dlmrt.decoding import make_rule
from dlmrt.engine import BlockEngine
from dlmrt.engine.block.round import RoundSpec, denoise_round
from dlmrt.impls.deepgemm_install import install_deepgemm
from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini, qwen_dlm_4b
from dlmrt.models.llada2 import LLaDA2

ROUNDS = 23  # QwenDLM: forced rounds per 256-row block


KV_DTYPE = "auto"  # --kv-cache-dtype


def _block(model, mode: str, context: int, rule, canvas: str = "masks"):
    """(engine, program, start): a block after `context` prefilled tokens, every row
    unresolved; canvas "masks" (a first round) or "random" tokens (rows as diverse as in later
    rounds: with random weights, an all-mask block routes every row to the same experts)."""
    dev, cfg = model.embed_table.device, model.cfg
    rows = cfg.block_size
    engine = BlockEngine(model, dev, torch.bfloat16, mode, kv_cache_dtype=KV_DTYPE)
    prog = engine.program(RoundSpec(model, rule, 0.0, rows), context + rows)
    gen = torch.Generator().manual_seed(context)  # every mode sees the same prompt and canvas
    ids = min(150000, cfg.vocab_size)  # token ids drawn below (a tiny test vocabulary: all)
    engine.prefill(torch.randint(0, ids, (context,), generator=gen).tolist(), rows, prog.kv)
    buf = prog.buf
    masks = torch.full((rows,), cfg.mask_token_id, device=dev)
    if canvas == "random":  # the same canvas in every mode: the experts it touches set the time
        masks = torch.randint(0, ids, (rows,), generator=gen).to(dev)
    unresolved = torch.ones(rows, dtype=torch.bool, device=dev)
    return engine, prog, lambda: buf.load(masks, unresolved, context, 0)


def time_mode(model, mode: str, context: int, iters: int, rule, canvas: str) -> tuple[float, int]:
    """(ms per round, rounds per block) over whole blocks."""
    with torch.inference_mode():
        _, prog, start = _block(model, mode, context, rule, canvas)
        rounds = []

        def block() -> None:
            start()
            prog.runner.run(prog.rounds)
            rounds.append(int(prog.buf.step))

        seconds = cuda_time(block, iters)
        return seconds / rounds[-1] * 1e3, rounds[-1]


def touched_experts(model, context: int, rule, canvas: str) -> TouchedExperts:
    """The experts one (first) round's routing selects, per MoE layer."""
    with torch.inference_mode():
        _, prog, start = _block(model, "eager", context, rule, canvas)
        start()
        counter = TouchedExperts(model)
        denoise_round(prog.spec, prog.buf, prog.kv)
        counter.close()
    return counter


def _heads(cfg) -> str:
    return f"{cfg.num_attention_heads}/{cfg.num_key_value_heads}"


def _experts(cfg) -> str:
    return f"{cfg.num_experts}x{cfg.moe_intermediate_size}"


def build(name: str, layers: int | None, canvas: str = "masks"):
    """(model, rule, floor(context) -> (FLOPs, bytes), shape dict for the result file)."""
    dev = torch.device("cuda")
    torch.manual_seed(0)  # the same random weights in every run
    if name == "qwen_dlm":
        cfg = qwen_dlm_4b(layers or 36)
        model = random_model(cfg, dev)
        shape = {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": _heads(cfg)}
        shape |= {"intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size}
        shape |= {"rows": cfg.block_size, "orl_adapter": True}
        rule = make_rule("fixed_steps", denoising_steps=ROUNDS)
        return model, rule, lambda ctx: round_flops_bytes(cfg, cfg.block_size, ctx), shape
    if name == "diffusion_gemma":
        from dlmrt.models.diffusion_gemma import DiffusionGemma

        cfg = diffusion_gemma_26b(layers or 30)
        model = random_model(cfg, dev, cls=DiffusionGemma)
        shape = {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size}
        shape |= {"experts": _experts(cfg), "top_k": cfg.top_k_experts}
        shape |= {"dense": cfg.intermediate_size, "vocab": cfg.vocab_size}
        shape |= {"rows": cfg.canvas_length, "rule": "entropy_bound_canvas"}

        def canvas_floor_of(ctx: int) -> tuple[float, float]:
            touched, out = canvas_floor(model, ctx)
            shape.setdefault("touched_experts_per_layer", {})[ctx] = touched.per_layer
            return out

        return model, None, canvas_floor_of, shape
    cfg = llada21_mini(layers or 20)
    model = random_model(cfg, dev, cls=LLaDA2)
    rule = make_rule("llada_editing", editing="quality")

    def floor(ctx: int) -> tuple[float, float]:
        touched = touched_experts(model, ctx, rule, canvas)
        shape.setdefault("touched_experts_per_layer", {})[ctx] = touched.per_layer
        return moe_round_floor(model, cfg.block_size, ctx, touched)

    shape = {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": _heads(cfg)}
    shape |= {"experts": _experts(cfg), "top_k": cfg.top_k}
    shape |= {"dense_layers": cfg.first_k_dense_replace, "vocab": cfg.vocab_size}
    shape |= {"rows": cfg.block_size, "rule": "llada_editing"}
    return model, rule, floor, shape


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", choices=["qwen_dlm", "llada2", "diffusion_gemma"], default="qwen_dlm"
    )
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--modes", nargs="+", default=["eager", "round_graph", "block_graph"])
    ap.add_argument("--layers", type=int, default=None, help="default: the model's own")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument(
        "--canvas",
        choices=["masks", "random"],
        default="masks",
        help="block contents: all masks, or random tokens (diverse rows: MoE routing spreads)",
    )
    ap.add_argument(
        "--route-to",
        type=int,
        default=0,
        help="MoE: bias every router so rows go to its first N experts only (touched experts per "
        "layer, as a real model's skewed routing; 0: random weights' own, about all)",
    )
    ap.add_argument("--no-gemm", action="store_true", help="skip the GEMM-only timing (qwen_dlm)")
    ap.add_argument("--quantization", choices=["none", "fp8", "nvfp4"], default="none")
    ap.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto")
    ap.add_argument("--out", default="benchmarks/results/round_latency.json")
    ap.add_argument("--git-revision", default=None)
    return ap.parse_args()


def _expert_share(shape: dict, context: int, model) -> float:
    """The share of all routed-expert weights one round reads (0 without experts)."""
    per_layer = shape.get("touched_experts_per_layer", {}).get(context)
    experts = getattr(model.cfg, "num_experts", 0)
    return sum(per_layer) / (len(per_layer) * experts) if per_layer and experts else 0.0


def _floors(args, model, floor_of, shape) -> dict[int, dict]:
    """Per context: the bf16 floor (ms, bound) before any quantization, and what it is made of."""
    out = {}
    for context in args.contexts:
        flops, nbytes = floor_of(context)
        floor = max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) * 1e3
        bound = "bytes" if nbytes / PEAK_BYTES > flops / PEAK_FLOPS else "flops"
        share = _expert_share(shape, context, model)
        out[context] = dict(floor=floor, bound=bound, flops=flops, nbytes=nbytes, share=share)
    return out


def _time(args, model, rule, context: int, mode: str) -> tuple[float, int]:
    if args.model == "diffusion_gemma":
        return time_canvas_mode(model, mode, context, args.iters, KV_DTYPE)
    return time_mode(model, mode, context, args.iters, rule, args.canvas)


def _row(context: int, mode: str, ms: float, rounds: int, f: dict, fp8_floor: float | None):
    """One result row (and its printed line): ms per round against the floors."""
    row = {"context": context, "mode": mode, "ms_per_round": round(ms, 3)}
    row |= {"rounds_per_block": rounds, "floor_ms": round(f["floor"], 3)}
    row |= {"floor_bound": f["bound"], "ratio_to_floor": round(ms / f["floor"], 2)}
    if fp8_floor is not None:
        row |= {"fp8_floor_ms": round(fp8_floor, 3), "ratio_to_fp8_floor": round(ms / fp8_floor, 2)}
    print(
        f"{context:>8} {mode:>12} {ms:>9.3f} {rounds:>7} {f['floor']:>7.3f} "
        f"{ms / f['floor']:>8.2f}" + (f" fp8 floor {fp8_floor:.3f}" if fp8_floor else ""),
        flush=True,
    )
    return row


def main() -> None:
    global KV_DTYPE
    args = _args()
    KV_DTYPE = args.kv_cache_dtype
    model, rule, floor_of, shape = build(args.model, args.layers, args.canvas)
    shape["canvas"] = args.canvas
    if args.route_to:
        shape["route_to"] = route_to_first(model, args.route_to)
    rows, gemm = [], None
    if args.model == "qwen_dlm" and not args.no_gemm:
        gemm = gemm_only_ms(model.cfg, 256, args.iters)
        print(f"GEMMs alone {gemm:.2f} ms")
    floors = _floors(args, model, floor_of, shape)
    quantize = {"fp8": fp8_model.quantize, "nvfp4": fp8_model.quantize_nvfp4}.get(args.quantization)
    installed = quantize(model) if quantize else None
    # as the loader does last: the bf16 projections left on DeepGEMM where it is installed and
    # faster at the block rows (without deep_gemm: nothing)
    print(f"DeepGEMM projections: {install_deepgemm(model, shape['rows'])}")
    per = 0.5625 if args.quantization == "nvfp4" else 1.0  # bytes a weight (fp8_floor_ms below)
    print(f"{'context':>8} {'mode':>12} {'ms/round':>9} {'rounds':>7} {'floor':>7} {'x floor':>8}")
    for context in args.contexts:
        f = floors[context]
        fp8_floor = None
        if installed is not None:
            rows_ = shape["rows"]
            fp8_floor = fp8_model.fp8_floor(
                f["flops"], f["nbytes"], installed, f["share"], rows_, per
            )
            fp8_floor *= 1e3
        for mode in args.modes:
            ms, rounds = _time(args, model, rule, context, mode)
            rows.append(_row(context, mode, ms, rounds, f, fp8_floor))
        torch.cuda.empty_cache()
    eager = {r["context"]: r["ms_per_round"] for r in rows if r["mode"] == "eager"}
    for r in rows:
        r["speedup_vs_eager"] = round(eager[r["context"]] / r["ms_per_round"], 2) if eager else None
    dtype = {"weights": args.quantization if installed else "bf16", "kv_cache": args.kv_cache_dtype}
    write_result(
        args.out,
        {
            "benchmark": "round_latency",
            "model": args.model,
            "command": command_line(),
            "shape": {**shape, "dtype": dtype},
            "fp8_installed_weights": None if installed is None else sum(installed.values()),
            "gemm_only_ms": None if gemm is None else round(gemm, 3),
            "results": rows,
            "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        },
        args.git_revision,
    )


if __name__ == "__main__":
    main()
