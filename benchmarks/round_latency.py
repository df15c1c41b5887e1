"""One denoising round of QwenDLM-4B shape (random bf16 weights, 256 rows) in each execution mode.

    python benchmarks/round_latency.py [--contexts 1024 4096] [--out benchmarks/results/round_latency.json]

A block is forced to 23 rounds (`fixed_steps`); ms/round = block time / 23, so the graph modes
include their per-round host work (round_graph: one replay + one `done` read per round;
block_graph: one launch per block). Also: the round's dense GEMMs alone (graph-replayed), and the
roofline floors FLOPs / 790 TFLOP/s and bytes / 4.3 TB/s.
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import (
    PEAK_BYTES,
    PEAK_FLOPS,
    cuda_time,
    qwen_dlm_4b,
    random_model,
    round_flops_bytes,
    write_result,
)

from dlmrt.decoding import make_rule
from dlmrt.engine.engine import Engine
from dlmrt.engine.round import RoundSpec

ROUNDS = 23


def time_mode(model, mode: str, context: int, iters: int) -> float:
    """ms per round, a block of 256 masks after `context` prefilled tokens."""
    dev = model.embed_table.device
    engine = Engine(model, dev, torch.bfloat16, mode)
    kv = engine._arena(context + 256)
    with torch.inference_mode():
        engine._prefill(torch.randint(0, 150000, (context,)).tolist(), 256, kv)
        spec = RoundSpec(model, make_rule("fixed_steps", denoising_steps=ROUNDS), 0.0, 256)
        runner, buf = engine._runner(spec, None)
        masks = torch.full((256,), 151669, device=dev)
        unresolved = torch.ones(256, dtype=torch.bool, device=dev)

        def block() -> None:
            buf.load(masks, unresolved, context, 0)
            assert runner.run_block(buf, kv, None, 256) == ROUNDS

        return cuda_time(block, iters) / ROUNDS * 1e3


def gemm_only_ms(cfg, rows: int, iters: int) -> float:
    """The round's weight GEMMs (36 layers + adapter + LM head + z GEMM), graph-replayed."""
    dev = torch.device("cuda")
    h = cfg.hidden_size
    x = torch.randn(rows, h, device=dev, dtype=torch.bfloat16)
    big = torch.randn(rows, cfg.intermediate_size, device=dev, dtype=torch.bfloat16)
    w = {
        "qkv": torch.randn(cfg.q_size + 2 * cfg.kv_size, h, device=dev, dtype=torch.bfloat16),
        "o": torch.randn(h, cfg.q_size, device=dev, dtype=torch.bfloat16),
        "gu": torch.randn(2 * cfg.intermediate_size, h, device=dev, dtype=torch.bfloat16),
        "d": torch.randn(h, cfg.intermediate_size, device=dev, dtype=torch.bfloat16),
        "head": torch.randn(cfg.vocab_size, h, device=dev, dtype=torch.bfloat16),
    }
    q = torch.randn(rows, cfg.q_size, device=dev, dtype=torch.bfloat16)
    p = torch.randn(rows, cfg.vocab_size, device=dev, dtype=torch.bfloat16)

    def gemms() -> None:
        for _ in range(cfg.num_hidden_layers + 1):  # + the adapter's MLP
            x @ w["qkv"].T, q @ w["o"].T, x @ w["gu"].T, big @ w["d"].T
        x @ w["head"].T, p @ w["head"]

    graph = torch.cuda.CUDAGraph()
    gemms()
    with torch.cuda.graph(graph):
        gemms()
    return cuda_time(graph.replay, iters) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--modes", nargs="+", default=["eager", "round_graph", "block_graph"])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/round_latency.json")
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args()
    cfg = qwen_dlm_4b(args.layers)
    model = random_model(cfg, torch.device("cuda"))
    rows, gemm = [], gemm_only_ms(cfg, 256, args.iters)
    print(
        f"{'context':>8} {'mode':>12} {'ms/round':>9} {'x floor':>8}   (GEMMs alone {gemm:.2f} ms)"
    )
    for context in args.contexts:
        flops, nbytes = round_flops_bytes(cfg, 256, context)
        floor = max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) * 1e3
        for mode in args.modes:
            ms = time_mode(model, mode, context, args.iters)
            rows.append(
                {
                    "context": context,
                    "mode": mode,
                    "ms_per_round": round(ms, 3),
                    "floor_ms": round(floor, 3),
                    "ratio_to_floor": round(ms / floor, 2),
                }
            )
            print(f"{context:>8} {mode:>12} {ms:>9.3f} {ms / floor:>8.2f}", flush=True)
        torch.cuda.empty_cache()
    write_result(
        args.out,
        {
            "benchmark": "round_latency",
            "command": " ".join(sys.argv),
            "shape": {
                "layers": args.layers,
                "hidden": 2560,
                "heads": "32/8",
                "intermediate": 9728,
                "vocab": 151936,
                "rows": 256,
                "dtype": "bf16",
                "orl_adapter": True,
            },
            "rounds_per_block": ROUNDS,
            "gemm_only_ms": round(gemm, 3),
            "results": rows,
            "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        },
        args.git_revision,
    )


if __name__ == "__main__":
    main()
