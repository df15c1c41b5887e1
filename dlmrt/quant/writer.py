"""Write an FP8 checkpoint (compressed-tensors, ModelOpt or transformers' block-scaled "fp8") from
an HF bf16/fp32 checkpoint.

Used by the round-trip tests and by a future `dlmrt quantize`. Every stored tensor that the policy
(`policy.py`) names an FP8 candidate and no `ignore` pattern matches is quantized (per channel or per
tensor, per expert for a stacked [E, N, K] tensor; or per 128x128 block, strategy "block", the
layout of `block_fp8.py`) and stored as e4m3 with its scale in `NAME_scale` (`NAME_scale_inv` in
the "fp8" format, which is block-scaled only);
everything else is copied unchanged. The config records the scheme and an ignore list: the given
patterns plus the linear modules left unquantized (routers, the ORL adapter, the self-conditioning
MLP), as llm-compressor and ModelOpt list them. Sharded checkpoints keep their shards (the index gains
the scale names). No input scales are written: dlmrt quantizes activations per row at run time.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dlmrt.formats.block_fp8 import quantize_blocks
from dlmrt.formats.fp8 import Fp8Weight, quantize_per_channel
from dlmrt.json_file import read_json
from dlmrt.loading.policy import UNQUANTIZED_LINEARS, classify, matches, module_names
from dlmrt.loading.quant_config import (
    COMPRESSED_TENSORS,
    FINEGRAINED,
    MODELOPT,
    STRATEGIES,
    read_quant_config,
)
from dlmrt.quant.per_tensor import quantize_per_tensor

FORMATS = (COMPRESSED_TENSORS, MODELOPT)
INDEX = "model.safetensors.index.json"
BLOCK = (128, 128)  # strategy "block"'s default block (DeepSeek-V3's, Qwen3-FP8's)


def write_fp8_checkpoint(
    src: str | Path,
    out: str | Path,
    *,
    fmt: str = COMPRESSED_TENSORS,
    strategy: str = "channel",
    ignore: Sequence[str] = (),
    block: tuple[int, int] = BLOCK,
) -> Path:
    """Copy checkpoint directory `src` to `out` with its FP8 candidates in FP8; returns `out`.
    `block`: the [rows, columns] of one scale under strategy "block"."""
    if fmt not in (*FORMATS, FINEGRAINED):
        raise ValueError(f"fmt: expected one of {', '.join(FORMATS)}, {FINEGRAINED}, got {fmt!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if (fmt == FINEGRAINED) != (strategy == "block") and fmt != COMPRESSED_TENSORS:
        raise ValueError(
            f"fmt {fmt!r} with strategy {strategy!r}: '{FINEGRAINED}' is block-scaled "
            "only, ModelOpt has no blocks"
        )
    src, out = Path(src), Path(out)
    declared = read_quant_config(src, read_json(src / "config.json"))
    if declared is not None:
        raise ValueError(f"{src}: already quantized ({declared.method}, {declared.source.name})")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != INDEX:
            shutil.copy2(f, out / f.name)
    kept_bf16: set[str] = set()
    weight_map: dict[str, str] = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors = _quantize_file(
            load_file(str(f)), fmt, (strategy, block), tuple(ignore), kept_bf16
        )
        save_file(tensors, str(out / f.name))
        weight_map.update({name: f.name for name in tensors})
    if (src / INDEX).is_file():
        index = read_json(src / INDEX)
        (out / INDEX).write_text(json.dumps({**index, "weight_map": weight_map}, indent=2))
    _write_config(out, fmt, (strategy, block), sorted(set(ignore) | kept_bf16))
    return out


def _quantize_file(
    tensors: dict[str, torch.Tensor],
    fmt: str,
    scheme: tuple[str, tuple[int, int]],
    ignore: tuple[str, ...],
    kept_bf16: set[str],
) -> dict[str, torch.Tensor]:
    strategy, block = scheme
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        fp8, why = classify(name)
        if fp8 and t.is_floating_point() and t.dim() in (2, 3) and not matches(ignore, name):
            if strategy == "block":
                suffix = "_scale_inv" if fmt == FINEGRAINED else "_scale"
                out[name], out[name + suffix] = quantize_blocks(t, block)
                continue
            w = (quantize_per_channel if strategy == "channel" else quantize_per_tensor)(t)
            out[name], out[name + "_scale"] = w.qweight, _stored_scale(w, fmt, strategy)
            continue
        if why in UNQUANTIZED_LINEARS:
            kept_bf16.add(module_names(name)[0])
        out[name] = t.contiguous()
    return out


def _stored_scale(w: Fp8Weight, fmt: str, strategy: str) -> torch.Tensor:
    """The scale in the format's layout: compressed-tensors keeps a trailing 1 ([N, 1], per tensor
    [1]); ModelOpt stores [N] (per tensor a scalar); a stacked tensor has a leading expert dim."""
    scale = w.scale if strategy == "channel" else w.scale[..., 0]  # per tensor: rows are equal
    if fmt == MODELOPT:
        return scale.contiguous()
    if strategy == "channel":
        return scale[..., None].contiguous()
    return (scale.reshape(-1, 1, 1) if scale.dim() == 1 else scale.reshape(1)).contiguous()


def _write_config(
    out: Path, fmt: str, scheme: tuple[str, tuple[int, int]], ignore: list[str]
) -> None:
    strategy, block = scheme
    if fmt == MODELOPT:
        algo = "FP8_PER_CHANNEL_PER_TOKEN" if strategy == "channel" else "FP8"
        hf = {
            "producer": {"name": "modelopt", "version": "dlmrt"},
            "quantization": {
                "quant_algo": algo,
                "kv_cache_quant_algo": None,
                "exclude_modules": ignore,
            },
        }
        (out / "hf_quant_config.json").write_text(json.dumps(hf, indent=2))
        return
    cfg = read_json(out / "config.json")
    if fmt == FINEGRAINED:
        cfg["quantization_config"] = {
            "quant_method": FINEGRAINED,
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(block),
            "modules_to_not_convert": ignore,
        }
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        return
    weights = {
        "num_bits": 8,
        "type": "float",
        "strategy": strategy,
        "symmetric": True,
        "dynamic": False,
    }
    acts = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
    if strategy == "block":  # llm-compressor's FP8_BLOCK: activations per column group
        weights["block_structure"] = list(block)
        acts |= {"strategy": "group", "group_size": block[1]}
    cfg["quantization_config"] = {
        "quant_method": COMPRESSED_TENSORS,
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
