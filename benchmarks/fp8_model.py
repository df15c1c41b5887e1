"""FP8 versions of the benchmarks' random models, and the FP8 roofline floor.

`quantize(model)` quantizes every FP8 candidate per channel and installs what `use_fp8` runs
(`dlmrt/models/fp8_install.py`); the rest is dequantized back. `fp8_floor` turns a bf16 floor
into the FP8 one: installed weights read at 1 byte (experts scaled by the share the round
touches), FLOPs of the FP8 GEMMs at 1,580 TFLOP/s, the rest unchanged (the KV arena counted at
its own width, bf16 unless --kv-cache-dtype fp8 halves it).
"""

from __future__ import annotations

import torch

from dlmrt.quant.fp8 import quantize_per_channel
from dlmrt.quant.policy import is_candidate

PEAK_FP8_FLOPS = 1580e12  # dense e4m3 on the H200 (2x bf16)


def quantize(model: torch.nn.Module) -> dict[str, int]:
    """Install FP8 weights; returns {installed parameter name: number of weights}."""
    fp8 = {}
    for name, p in model.named_parameters():
        if p.dim() >= 2 and is_candidate(name):
            fp8[name] = quantize_per_channel(p.detach())
    left = set(model.use_fp8(fp8))
    with torch.no_grad():
        for name in left:
            model.get_parameter(name).copy_(fp8[name].dequantize(model.embed_table.dtype))
    torch.cuda.empty_cache()
    kinds = sorted({n.split(".")[-2] if "experts" not in n else "experts" for n in fp8})
    ran = sorted(
        {n.split(".")[-2] if "experts" not in n else "experts" for n in fp8 if n not in left}
    )
    print(f"fp8 candidates {kinds}; installed as FP8: {ran}", flush=True)
    return {n: fp8[n].qweight.numel() for n in fp8 if n not in left}


def fp8_floor(
    flops: float, nbytes: float, installed: dict[str, int], expert_share: float, rows: int
) -> float:
    """Seconds: max(FLOPs at their peaks, bytes / 4.3 TB/s) with the installed weights at 1 byte."""
    dense = sum(n for name, n in installed.items() if "experts." not in name)
    experts = sum(n for name, n in installed.items() if "experts." in name)
    saved = dense + experts * expert_share  # bytes: 2 -> 1 per weight
    fp8_flops = 2 * rows * dense  # dense FP8 GEMMs; the experts multiply in bf16
    time_flops = (flops - fp8_flops) / 790e12 + fp8_flops / PEAK_FP8_FLOPS
    return max(time_flops, (nbytes - saved) / 4.3e12)
