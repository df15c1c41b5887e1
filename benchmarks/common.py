"""Shared pieces of the device benchmarks: a random-weight model of a config, floors, timers and
result files (the full-size configs: `dlmrt/model_shapes.py`)."""

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
from dlmrt.impls.glu_install import install_bf16_glu
from dlmrt.model_shapes import layer_widths
from dlmrt.models.config import ModelConfig
from dlmrt.models.diffusion_gemma_config import SLIDING, DiffusionGemmaConfig
from dlmrt.models.qwen_dlm import QwenDLM
from dlmrt.ops import choices

# Measured copy bandwidth (bytes/s) of the GPUs the floors are stated for: the H100's HBM3
# reaches ~3.0 TB/s in a device-to-device copy, the H200's HBM3e ~4.3 TB/s.
COPY_BANDWIDTH = {"H100": 3.0e12, "H200": 4.3e12}


def device_copy_bandwidth(name: str | None = None) -> float:
    """The measured copy bandwidth of the GPU named `name` (default: CUDA device 0; the H200's
    on a machine without one or a GPU not in the table)."""
    if name is None:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return next((bw for key, bw in COPY_BANDWIDTH.items() if key in name), COPY_BANDWIDTH["H200"])


PEAK_FLOPS = 790e12  # dense bf16, the same on the H100 and H200 (FP8: twice)
PEAK_BYTES = device_copy_bandwidth()  # the floors follow the device the benchmark runs on


def random_model(
    cfg, device: torch.device, dtype=torch.bfloat16, cls: type[torch.nn.Module] = QwenDLM
) -> torch.nn.Module:
    """`cls(cfg)` allocated on the device without initialising, then N(0, 0.02) weights, buffers
    set (names with "bias": 0, e.g. LLaDA2's expert_bias; others 1: scalars and scales), the LM
    head tied when the config says so, projections fused (and the dense MLPs' gate|up +
    activation in one kernel where DLMRT_BF16_GLU chooses it)."""
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
    # as the loader does: DLMRT_BF16_GLU's one-kernel gate|up (off by default: nothing done); a
    # benchmark that quantizes to FP8 afterwards replaces it, though its choices stay recorded
    install_bf16_glu(model)
    return model


def block_attention_shape(cfg) -> tuple[int, int, int]:
    """(rows, query heads, KV heads) of a block style's round attention (QwenDLM, LLaDA2)."""
    return cfg.block_size, cfg.num_attention_heads, cfg.num_key_value_heads


def canvas_attention_shape(cfg: DiffusionGemmaConfig, kind: str) -> tuple[int, int, int, int]:
    """(query heads, KV heads, head dim, window; 0: none) of DiffusionGemma's `kind` layers."""
    dim, kv_heads = layer_widths(cfg, kind)
    return cfg.num_attention_heads, kv_heads, dim, cfg.sliding_window if kind == SLIDING else 0


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
    """Seconds `fn` takes, its CUDA work included (no sync where CUDA was never used: the CPU)."""
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else lambda: None
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def git_revision() -> str:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return rev.stdout.strip() or "unknown"


def command_line() -> str:
    """How this run started, for a result's `command`: `python -m benchmarks.<module> <args>`
    (the module's path otherwise, e.g. a test calling its `main`)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    name = f"python -m {spec.name}" if spec is not None else sys.argv[0]
    return " ".join([name, *sys.argv[1:]])


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
        payload = {"benchmark": name, "command": command_line(), "results": rows}
        write_result(args.out, payload, args.git_revision)
