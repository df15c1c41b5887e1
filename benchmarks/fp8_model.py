"""FP8 versions of the benchmarks' random models, and the FP8 roofline floor.

`quantize(model)` quantizes every FP8 candidate per channel and installs what `use_quantized` runs
(`dlmrt/impls/install.py`); the rest is dequantized back. `fp8_floor` turns a bf16 floor
into the FP8 one: installed weights read at 1 byte (experts scaled by the share the round
touches), FLOPs of the FP8 GEMMs at 1,580 TFLOP/s, the rest unchanged (the KV arena counted at
its own width, bf16 unless --kv-cache-dtype fp8 halves it).
"""

from __future__ import annotations

import torch

from benchmarks.common import PEAK_BYTES
from dlmrt.loading.placement import install, quantize_candidates

PEAK_FP8_FLOPS = 1580e12  # dense e4m3 on the H200 (2x bf16)


def quantize(model: torch.nn.Module) -> dict[str, int]:
    """Install FP8 weights; returns {installed parameter name: number of weights}."""
    fp8 = quantize_candidates(model)
    left = set(install(model, fp8)[1])
    torch.cuda.empty_cache()
    kinds = sorted({n.split(".")[-2] if "experts" not in n else "experts" for n in fp8})
    ran = sorted(
        {n.split(".")[-2] if "experts" not in n else "experts" for n in fp8 if n not in left}
    )
    print(f"fp8 candidates {kinds}; installed as FP8: {ran}", flush=True)
    return {n: fp8[n].qweight.numel() for n in fp8 if n not in left}


def quantize_nvfp4(model: torch.nn.Module) -> dict[str, int]:
    """Install what `dlmrt quantize --format nvfp4` writes in NVFP4 (routed experts and dense MLPs,
    amax scales; the W4A16 kernels); returns {name: weights}."""
    from dlmrt.formats.nvfp4 import quantize_nvfp4 as nvfp4
    from dlmrt.quant.nvfp4_writer import is_nvfp4_target

    names = [n for n, _ in model.named_parameters() if is_nvfp4_target(n)]
    weights = {n: nvfp4(model.get_parameter(n).detach()).to("cpu") for n in names}  # as read
    sizes = {n: model.get_parameter(n).numel() for n in names}
    left = set(model.use_quantized(weights))
    torch.cuda.empty_cache()
    dense = sum(".experts." not in n for n in names if n not in left)
    print(f"nvfp4 installed: {len(names) - len(left)} tensors ({dense} dense)", flush=True)
    return {n: sizes[n] for n in names if n not in left}


def fp8_floor(
    flops: float,
    nbytes: float,
    installed: dict[str, int],
    expert_share: float,
    rows: int,
    bytes_per: float = 1.0,
) -> float:
    """Seconds: max(FLOPs at their peaks, bytes / the device's copy bandwidth) with the installed weights at
    `bytes_per` bytes (FP8 1, NVFP4 0.5625)."""
    dense = sum(n for name, n in installed.items() if "experts." not in name)
    experts = sum(n for name, n in installed.items() if "experts." in name)
    saved = (dense + experts * expert_share) * (2 - bytes_per)  # bytes: 2 -> bytes_per a weight
    fp8_flops = 2 * rows * dense if bytes_per == 1.0 else 0  # dense FP8 GEMMs; experts in bf16
    time_flops = (flops - fp8_flops) / 790e12 + fp8_flops / PEAK_FP8_FLOPS
    return max(time_flops, (nbytes - saved) / PEAK_BYTES)
