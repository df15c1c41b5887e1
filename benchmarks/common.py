"""Shared pieces of the device benchmarks: the QwenDLM-4B shape with random weights, result files."""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dlmrt import capture_guard
from dlmrt.models.config import ModelConfig
from dlmrt.models.qwen_dlm import QwenDLM
from dlmrt.models.residual import ResidualConfig
from dlmrt.ops import choices

PEAK_FLOPS = 790e12  # measured bf16 dense on the H200
PEAK_BYTES = 4.3e12  # HBM3e bytes/s


def qwen_dlm_4b(layers: int = 36) -> ModelConfig:
    """QwenDLM-4B + ORL adapter (Qwen3-4B dims, 256-token blocks)."""
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


def random_model(
    cfg, device: torch.device, dtype=torch.bfloat16, cls: type[torch.nn.Module] = QwenDLM
) -> torch.nn.Module:
    """`cls(cfg)` allocated on the device without initialising, then N(0, 0.02) weights, buffers
    set (names with "bias": 0, e.g. LLaDA2's expert_bias; others 1: scalars and scales), the LM
    head tied when the config says so, projections fused."""
    with torch.device("meta"):
        model = cls(cfg).to(dtype)
    model = model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
        for name, b in model.named_buffers():
            b.zero_() if "bias" in name else b.fill_(1)
    model = model.eval().requires_grad_(False)
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_lm_head()
    model.fuse_projections()
    return model


def round_flops_bytes(cfg: ModelConfig, rows: int, context: int) -> tuple[float, float]:
    """FLOPs and minimum HBM bytes of one denoising round (weights + KV read once, bf16)."""
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    per_layer = h * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 3 * h * inter
    adapter = 3 * h * cfg.residual.intermediate_size if cfg.residual else 0
    head = cfg.vocab_size * h * (2 if cfg.residual else 1)  # LM head + z = p^T E
    weights = layers * per_layer + adapter + head
    attn = layers * 4 * rows * (context + rows) * cfg.q_size
    kv_bytes = layers * 2 * (context + rows) * cfg.kv_size * 2
    return 2 * weights * rows + attn, (
        layers * per_layer + adapter + cfg.vocab_size * h
    ) * 2 + kv_bytes


def cuda_time(fn: Callable[[], None], iters: int, warmup: int = 2) -> float:
    """Median seconds of fn() over iters, each bracketed by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def wall_time(fn: Callable[[], None]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def git_revision() -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return rev.stdout.strip() or "unknown"


def write_result(path: str, payload: dict, revision: str | None) -> None:
    payload = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_revision": revision or git_revision(),
        "torch": torch.__version__,
        **payload,
        # every implementation choice the run made (dlmrt/ops/choices.py), one line each
        "choices": [c.line() for c in choices.recorded()],
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")


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
    with capture_guard.graph(graph):
        gemms()
    return cuda_time(graph.replay, iters) * 1e3


def graph_ms(fn: Callable[[], None], iters: int) -> float:
    """Median ms of fn() captured once as a CUDA graph (warmed up on a side stream), replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        fn()
    return cuda_time(graph.replay, iters) * 1e3


def iters_parser(
    doc: str | None, iters: int = 50, out: str | None = None
) -> argparse.ArgumentParser:
    """The flags of a kernel benchmark: --iters (timed replays), --out (JSON), --git-revision;
    each script adds its own."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--iters", type=int, default=iters, help="timed iterations per case")
    ap.add_argument("--out", default=out, help="JSON result path (default: %(default)s)")
    ap.add_argument("--git-revision", default=None)
    return ap


def request_parser(doc: str | None, out: str) -> argparse.ArgumentParser:
    """The flags of an end-to-end request benchmark (`rounds/e2e_tps.py`, `rounds/drafts_overhead.py`):
    the request's shape, the execution modes, the result file; each script adds its own."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=23, help="denoising rounds per block")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=1024)
    ap.add_argument("--modes", nargs="+", default=["eager", "round_graph", "block_graph"])
    ap.add_argument("--out", default=out, help="JSON result path")
    ap.add_argument("--git-revision", default=None)
    return ap


def shapes_main(name: str, doc: str | None, bench: Callable[..., dict], shapes) -> None:
    """The CLI of a per-shape benchmark (`moe_fp8.py`, `moe_nvfp4.py`): `iters_parser`'s flags;
    one `bench(shape, iters)` row per shape, printed and written as JSON."""
    args = iters_parser(doc).parse_args()
    with torch.inference_mode():
        rows = [bench(s, args.iters) for s in shapes]
    for r in rows:
        print(r, flush=True)
    if args.out:
        cmd = f"{name}.py " + " ".join(sys.argv[1:])
        payload = {"benchmark": name, "command": cmd, "results": rows}
        write_result(args.out, payload, args.git_revision)
