"""Which dense linears run as FP8 GEMMs, and on which GEMM: measured per shape, once, at start-up.

FP8 does not win everywhere: at 32 rows the o and down projections of a 4B model run slower
as `torch._scaled_mm` than as bf16 cuBLAS (docs/quantization.md has the table). So each distinct
(rows, N, K) is timed as bf16 cuBLAS, as FP8 cuBLAS and as our split-K FP8 kernel
(kernels/fp8_gemm.py) over a few tile / split configurations (a CUDA graph of 20-32 calls,
replayed: GPU time only), the calls cycling over enough copies of the weight to exceed the L2
cache: in a round every layer's weight comes from HBM (timed with one weight, the 25 MB FP8 down
projection of QwenDLM-4B stays in the H200's 50 MB L2 and a kernel that streams HBM poorly
measured 18 µs, then took 27 in the round); the fastest is kept, unless DLMRT_FP8_GEMMS says "all" or "none" (then FP8 on
whichever FP8 GEMM times faster). The FP8 times include the activation's quantization only when
its producer is not fused (`fused_input=False`). CPU: always FP8 (the torch twin runs; it exists
to test numerics, not speed). DLMRT_FP8_GEMM_KERNEL=cublas|triton pins the FP8 GEMM (tests).
Each shape's choice is recorded in the choices registry (`ops/choices.py`: logged once).
"""

from __future__ import annotations

import itertools
import logging

import torch
import torch.nn.functional as F

from dlmrt import envs
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.ops import choices
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops.timing import graph_time_us

log = logging.getLogger("dlmrt")
# (rows, n, k, fused_input, pinned GEMM) -> (bf16 µs, best FP8 µs, its config: None = cuBLAS)
_MEASURED: dict[tuple, tuple[float, float, tuple | None]] = {}


COPIES = 32  # at most this many weight copies in one timing
L2_BYTES = 2 * 50 * 2**20  # twice the H200's L2: the copies' FP8 bytes to cycle over


def cold_time_us(fn, weights: list) -> float:
    """GPU µs per call of fn(weight), the calls of the timed graph cycling over `weights` (so a
    weight is read from HBM, as in a round, not from the L2 cache)."""
    cycle = itertools.cycle(weights)
    return graph_time_us(lambda: fn(next(cycle)), reps=max(20, len(weights)))


def candidates(rows: int, n: int, k: int, sms: int) -> list[tuple[int, ...]]:
    """Configs (bm, bn, bk, split, stages, warps, tma) of kernels/fp8_gemm.py worth timing: tiles
    of 64 rows at <= 64 rows (the smallest wgmma), 128 at <= 128, else also 256-row and 256-wide
    tiles (TMA only: they need its copy engine to keep the MMAs fed); K split only while the
    slices stay >= 256 deep and the programs <= 4 waves; operands by pointers or by TMA."""
    bm = 64 if rows <= 64 else 128
    tiles = [(bm, 64, 0), (bm, 128, 0)]
    if rows > 128:
        tiles += [(256, 64, 1), (256, 128, 1), (128, 256, 1)]
    out = []
    for bm, bn, big in tiles:
        count = -(-rows // bm) * -(-n // bn)
        warps, stages = (8, 3) if big else (8 if bm * bn >= 128 * 128 else 4, 4)
        for split in sorted({effective_split(k, 128, s) for s in (1, 2, 3, 4, 6, 8)}):
            if split == 1 or (k // split >= 256 and count * split <= 4 * sms):
                out += [
                    (bm, bn, 128, split, stages, warps, tma) for tma in ((1,) if big else (0, 1))
                ]
    return out


def effective_split(k: int, bk: int, split: int) -> int:
    """The K slices kernels/fp8_gemm.py runs when asked for `split` (whole BK steps a slice, no
    empty slice: K = 2,112 asked in 8 runs 6 slices of 384)."""
    steps = -(-k // bk)  # ceil: BK steps of K
    k_slice = -(-steps // split) * bk
    return -(-k // k_slice)


def cold_weights(n: int, k: int, device: torch.device) -> tuple[list, list]:
    """(bf16 weights, their FP8 codes): enough [n, k] copies that the FP8 ones exceed the L2
    (`cold_time_us` cycles over them)."""
    copies = min(COPIES, -(-L2_BYTES // (n * k)))
    ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
    return ws, [quantize_per_channel(w) for w in ws]


def kernel_times(
    rows: int, n: int, k: int, arg, wqs: list, device: torch.device
) -> dict[tuple, float | str]:
    """µs of kernels/fp8_gemm.py per candidate config over `arg` (codes or a plain activation)
    and the cold weights `wqs`; a config that does not run here (a tile too big for this GPU's
    shared memory) maps to its error's name."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out: dict[tuple, float | str] = {}
    for config in candidates(rows, n, k, sms):
        plan = fp8_ops.GemmPlan.new(rows, n, config, device)
        try:
            out[config] = cold_time_us(lambda w, p=plan: fp8_ops.fp8_linear(arg, w, plan=p), wqs)
        except Exception as e:  # noqa: BLE001 (recorded, never fatal: the choice skips it)
            log.debug("fp8 GEMM config %s skipped: %s", config, str(e).splitlines()[0])
            out[config] = type(e).__name__
    return out


def measure(
    rows: int, n: int, k: int, device: torch.device, fused_input: bool
) -> tuple[float, float, tuple | None]:
    """(bf16 µs, fastest FP8 µs, its config or None for cuBLAS) of one [rows, k] x [k, n] GEMM
    on `device` (cached per shape)."""
    pinned = envs.fp8_gemm_kernel()
    key = (rows, n, k, fused_input, pinned)
    if key in _MEASURED:
        return _MEASURED[key]
    x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
    ws, wqs = cold_weights(n, k, device)
    xq = fp8_ops.quant_rows(x)
    arg = xq if fused_input else x
    bf16 = cold_time_us(lambda w: F.linear(x, w), ws)
    times: dict[tuple | None, float] = {}
    if pinned != "triton":
        times[None] = cold_time_us(lambda w: fp8_ops.fp8_linear(arg, w), wqs)
    if pinned != "cublas":
        ran = kernel_times(rows, n, k, arg, wqs, device)
        times |= {config: t for config, t in ran.items() if isinstance(t, float)}
    if not times:  # pinned to our kernel and no config of it runs here: the linear stays bf16
        log.warning("fp8 GEMM %dx%d->%d: no config of kernels/fp8_gemm.py runs here", rows, k, n)
        _MEASURED[key] = (bf16, float("inf"), None)
        return _MEASURED[key]
    best = min(times, key=times.__getitem__)
    _MEASURED[key] = (bf16, times[best], best)
    return _MEASURED[key]


def describe(config: tuple | None) -> str:
    if config is None:
        return "cuBLAS"
    bm, bn, _, split, _, _, tma = config
    return (
        f"split-K kernel {bm}x{bn}"
        + (f", K in {split}" if split > 1 else "")
        + (", TMA" if tma else "")
    )


def use_fp8_gemm(
    rows: int, n: int, k: int, device: torch.device, fused_input: bool = True
) -> tuple[bool, str, tuple | None]:
    """(run this linear as an FP8 GEMM?, why, the FP8 GEMM's config: None = cuBLAS) for `rows`
    rows of [k] -> [n]; recorded in the choices registry under `gemm_key`."""
    ok, why, config, options = _decide(rows, n, k, device, fused_input)
    pick = f"FP8 on {describe(config)}" if ok else "bf16"
    choices.record(gemm_key(rows, n, k, fused_input), pick, why, options)
    return ok, why, config


def gemm_key(rows: int, n: int, k: int, fused_input: bool) -> str:
    """The registry key of a dense linear's FP8-or-bf16 choice."""
    return f"fp8 gemm {rows}x{k}->{n}" + ("" if fused_input else ", input quantized before it")


def _decide(
    rows: int, n: int, k: int, device: torch.device, fused_input: bool
) -> tuple[bool, str, tuple | None, dict[str, float]]:
    if k % 16 or n % 16:
        return False, f"{n}x{k}: FP8 GEMMs need both dims multiples of 16", None, {}
    policy = envs.fp8_gemms()
    if device.type != "cuda":
        return policy != "none", "CPU", None, {}
    if policy == "none":
        return False, "DLMRT_FP8_GEMMS=none", None, {}
    bf16, fp8, config = measure(rows, n, k, device, fused_input)
    options = {"bf16": bf16, f"FP8 on {describe(config)}": fp8}
    why = f"{rows}x{k}->{n}: bf16 {bf16:.1f} us, fp8 {fp8:.1f} us on {describe(config)}"
    if policy == "all" and fp8 < float("inf"):
        return True, f"DLMRT_FP8_GEMMS=all; {why}", config, options
    return fp8 < bf16, why, config, options
