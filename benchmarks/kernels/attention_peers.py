"""Block-row arena attention beside its peers at the models' round shapes (one H200, bf16).

python -m benchmarks.kernels.attention_peers [--iters 30] [--variants triton flashinfer_fa3 ...]
    [--out results/attention_peers_h200_DATE.json]

A round's attention: `rows` query rows of one block, all seeing the same keys (the prefix and
the whole block: non-causal over context + rows keys). Per case, us per layer (`LAYERS` calls on
distinct arena layers in one CUDA graph, as in attention_tiles.py) of:
- `triton`: our one-pass kernel as shipped (kernels/arena_attention.py, `tile_config`);
- `triton_ws`: the same with Triton's warp-specialized key loop (`tl.range(warp_specialize=True)`);
- `flashinfer_fa2` / `flashinfer_fa3`: FlashInfer's `single_prefill_with_kv_cache` (non-causal,
  K / V in the arena's [kv_heads, keys, dim] layout, "HND"; q as [rows, heads, dim]), on its FA2
  and its SM90 FA3 backend (JIT-compiled on first use); `flashinfer_fa3_nhd`: FA3 on [keys,
  kv_heads, dim] copies. A variant whose build or launch kills the process (Triton's Hopper
  warp-specialization pass asserting, FA3 dying of SIGFPE with FlashInfer 0.7.4 here) is run
  alone with `--variants`. FlashInfer is optional: without it those
  entries say so. FlashAttention-4's numbers at these shapes: docs/kernels.md.
Floors: FLOPs (4 rows keys heads dim at 790 TFLOP/s) and bytes (the visible K and V at the device's copy bandwidth (`common.PEAK_BYTES`));
`max_abs_diff` of each against ours.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import PEAK_BYTES, block_attention_shape, graph_ms, write_result
from dlmrt.model_shapes import llada21_mini, qwen_dlm_4b

LAYERS, PEAK_FLOPS, DIM = 16, 790e12, 128
VARIANTS = ["triton", "triton_ws", "flashinfer_fa2", "flashinfer_fa3", "flashinfer_fa3_nhd"]
SHAPES = {  # rows, heads, kv heads
    "qwen_dlm_256": block_attention_shape(qwen_dlm_4b()),
    "llada2_32": block_attention_shape(llada21_mini()),
}


def _per_call_us(call, iters: int) -> float:
    """µs per layer of call(layer) over LAYERS distinct layers, replayed from one CUDA graph."""
    return graph_ms(lambda: [call(layer) for layer in range(LAYERS)], iters) * 1e3 / LAYERS


def _flashinfer():
    try:
        from flashinfer.prefill import single_prefill_with_kv_cache
    except Exception as exc:  # noqa: BLE001 (optional peer: recorded)
        return None, f"not installed ({type(exc).__name__}: {str(exc)[:80]})"
    return single_prefill_with_kv_cache, None


def case(name: str, context: int, iters: int, variants: list[str]) -> dict:
    from dlmrt._kernels.arena_attention import arena_attention

    rows, heads, kv_heads = SHAPES[name]
    keys = context + rows
    gen = torch.Generator("cuda").manual_seed(context + rows)
    q = torch.randn(heads, rows, DIM, device="cuda", generator=gen, dtype=torch.bfloat16)
    kv = torch.randn(
        2, LAYERS, kv_heads, keys, DIM, device="cuda", generator=gen, dtype=torch.bfloat16
    )
    pos = torch.arange(context, context + rows, device="cuda")
    scale = DIM**-0.5
    ref = arena_attention(q, kv[0, 0], kv[1, 0], pos, rows, scale, splits=1)
    q_nhd = q.transpose(0, 1).contiguous()
    prefill, missing = _flashinfer()
    calls = {
        "triton": lambda i: arena_attention(q, kv[0, i], kv[1, i], pos, rows, scale, splits=1),
        "triton_ws": lambda i: arena_attention(
            q, kv[0, i], kv[1, i], pos, rows, scale, splits=1, ws=True
        ),  # fmt: skip
    }
    if prefill is not None:  # FA3 with K / V as [keys, kv_heads, dim] copies (its NHD layout)
        kv_nhd = kv.transpose(2, 3).contiguous()
        calls["flashinfer_fa3_nhd"] = lambda i: prefill(
            q_nhd,
            kv_nhd[0, i],
            kv_nhd[1, i],
            causal=False,
            kv_layout="NHD",
            sm_scale=scale,
            backend="fa3",
        ).transpose(0, 1)
    for backend in ("fa2", "fa3"):
        if prefill is not None:
            calls[f"flashinfer_{backend}"] = lambda i, b=backend: prefill(
                q_nhd, kv[0, i], kv[1, i], causal=False, kv_layout="HND", sm_scale=scale, backend=b
            ).transpose(0, 1)
    row = {
        "case": name, "context": context, "keys": keys,
        "floor_flops_us": round(4 * rows * keys * heads * DIM / PEAK_FLOPS * 1e6, 2),
        "floor_bytes_us": round(2 * kv_heads * keys * DIM * 2 / PEAK_BYTES * 1e6, 2),
        "us": {}, "max_abs_diff": {},
    }  # fmt: skip
    if missing:
        row["flashinfer"] = missing
    for label, call in calls.items():
        if label not in variants:
            continue
        try:
            out = call(0)
            row["max_abs_diff"][label] = float((out.float() - ref.float()).abs().max())
            row["us"][label] = round(_per_call_us(call, iters), 2)
        except Exception as exc:  # noqa: BLE001 (a variant that does not build here: recorded)
            row["us"][label] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [case(name, ctx, args.iters, args.variants) for name in SHAPES for ctx in (1024, 4096)]
    if args.out:
        write_result(args.out, {"rows": rows}, None)


if __name__ == "__main__":
    main()
