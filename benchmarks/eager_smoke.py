"""Eager-mode baseline on the device: one denoising round of a QwenDLM-4B-shaped model, and a request.

    python benchmarks/eager_smoke.py [--layers 36] [--out benchmarks/results/eager_smoke.json]

Random bf16 weights (latency does not depend on values). Reports the round latency against the
compute floor (2 * params * rows / 790 TFLOP/s) and the weight-read floor (bytes / 4.3 TB/s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import time
from pathlib import Path

import torch

from dlmrt.blocks import initial_canvas, layout
from dlmrt.decoding import make_rule
from dlmrt.engine.engine import Engine
from dlmrt.engine.kv_cache import KVCache
from dlmrt.engine.round import RoundSpec, denoise_round, initial_state
from dlmrt.models.config import ModelConfig
from dlmrt.models.qwen_dlm import QwenDLM
from dlmrt.models.residual import ResidualConfig


def qwen_dlm_4b(layers: int) -> ModelConfig:
    return ModelConfig(
        architecture="SDARForCausalLM",
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=5e6,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        mask_token_id=151669,
        block_size=256,
        residual=ResidualConfig(
            intermediate_size=9728, input_scale=0.125, output_scale=0.125, post_norm_scale=0.02
        ),
    )


def random_model(cfg: ModelConfig, device: torch.device) -> QwenDLM:
    with torch.device("meta"):
        model = QwenDLM(cfg).to(torch.bfloat16)
    model = model.to_empty(device=device)
    model.tie_lm_head()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model.eval().requires_grad_(False)


def time_round(model: QwenDLM, context: int, iters: int) -> float:
    dev = model.embed_table.device
    lay = layout(context, 256, 256)
    kv = KVCache(model.cfg.num_hidden_layers, 8, 128, lay.max_len, torch.bfloat16, dev)
    spec = RoundSpec(model, make_rule("entropy_budget"), 0.0, 256)
    canvas, unresolved = initial_canvas(lay, lay.first_block, list(range(context)), 151669, dev)
    state = initial_state(canvas, unresolved, spec)
    pos = torch.arange(lay.first_block * 256, (lay.first_block + 1) * 256, device=dev)
    with torch.inference_mode():
        for _ in range(3):
            denoise_round(spec, state, pos, kv, lay.max_len)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            denoise_round(spec, state, pos, kv, lay.max_len)
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def _git_revision() -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return rev.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/eager_smoke.json")
    ap.add_argument("--git-revision", default=None, help="recorded revision (default: git rev-parse)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = qwen_dlm_4b(args.layers)
    model = random_model(cfg, dev)
    params = (
        sum(p.numel() for p in model.parameters()) - cfg.vocab_size * cfg.hidden_size
    )  # embed lookup
    round_ms = time_round(model, 1024, args.iters)
    engine = Engine(model, dev, torch.bfloat16)
    prompt = list(range(1000, 1100))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = engine.generate(
        prompt,
        rule=make_rule("entropy_budget"),
        block_size=256,
        max_new_tokens=256,
        mask_id=151669,
        stop_ids=set(),
        ignore_eos=True,
    )
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    result = {
        "benchmark": "eager_smoke",
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_revision": args.git_revision or _git_revision(),
        "torch": torch.__version__,
        "shape": {
            "layers": args.layers,
            "hidden": 2560,
            "rows": 256,
            "context": 1024,
            "dtype": "bf16",
        },
        "round_ms_eager": round(round_ms, 3),
        "floor_compute_ms": round(2 * params * 256 / 790e12 * 1e3, 3),
        "floor_weights_ms": round(params * 2 / 4.3e12 * 1e3, 3),
        "request": {
            "prompt_tokens": len(prompt),
            "generated": len(res.token_ids),
            "denoising_forwards": res.denoising_forwards,
            "wall_s": round(wall, 3),
            "tokens_per_s": round(len(res.token_ids) / wall, 1),
        },
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
