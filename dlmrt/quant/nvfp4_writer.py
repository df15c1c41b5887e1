"""Write an NVFP4 checkpoint (ModelOpt or compressed-tensors layout) from an HF bf16/fp32 checkpoint.

`dlmrt quantize --format nvfp4` and the round-trip tests use it. The weights quantized are the
routed experts and the dense MLPs (not shared experts: their input also feeds the router), as in
the ORL paper; attention, routers, embeddings, the ORL adapter and the self-conditioning MLP stay in
the checkpoint's dtype and are listed in the ignore list (`exclude_modules` / `ignore`), so other
NVFP4 loaders leave them alone too. Tensor names: `nvfp4_reader.py`. The block scales come from
`quantizer(stored name, tensor)` (default amax / 6, `nvfp4.quantize_nvfp4`; `dlmrt quantize` passes
the local-Hessian search). Input scales (for W4A4 loaders; dlmrt runs weight-only W4A16 and drops
them) are written where `input_amax(stored name)` knows the calibration inputs' amax: ModelOpt
`x.input_scale` = amax / (6 · 448), compressed-tensors `x.input_global_scale` = its reciprocal.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dlmrt.formats.fp8 import FP8_MAX
from dlmrt.formats.nvfp4 import BLOCK, E2M1_MAX, MIN_GLOBAL, Nvfp4Weight, quantize_nvfp4
from dlmrt.json_file import read_json
from dlmrt.loading.nvfp4_reader import stored_names
from dlmrt.loading.policy import UNQUANTIZED_LINEARS, classify, matches, module_names
from dlmrt.loading.quant_config import COMPRESSED_TENSORS, CT_NVFP4, MODELOPT, read_quant_config
from dlmrt.quant.writer import FORMATS, INDEX

Quantizer = Callable[[str, torch.Tensor], Nvfp4Weight]


def is_nvfp4_target(name: str) -> bool:
    """Whether `dlmrt quantize --format nvfp4` quantizes this stored tensor (see the docstring)."""
    why = classify(name)[1]
    return why == "routed experts" or (why == "dense MLP" and ".shared_experts." not in name)


def write_nvfp4_checkpoint(
    src: str | Path,
    out: str | Path,
    *,
    fmt: str = MODELOPT,
    ignore: Sequence[str] = (),
    quantizer: Quantizer | None = None,
    input_amax: Callable[[str], torch.Tensor | None] | None = None,
) -> Path:
    """Copy checkpoint directory `src` to `out` with its NVFP4 targets in NVFP4; returns `out`."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    src, out = Path(src), Path(out)
    declared = read_quant_config(src, read_json(src / "config.json"))
    if declared is not None:
        raise ValueError(f"{src}: already quantized ({declared.method}, {declared.source.name})")
    quantizer = quantizer or (lambda _name, t: quantize_nvfp4(t))
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != INDEX:
            shutil.copy2(f, out / f.name)
    kept: set[str] = set()
    weight_map: dict[str, str] = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors = _quantize_file(load_file(str(f)), fmt, tuple(ignore), kept, quantizer)
        if input_amax is not None:
            tensors |= _input_scales(tensors, fmt, input_amax)
        save_file(tensors, str(out / f.name))
        weight_map.update({name: f.name for name in tensors})
    if (src / INDEX).is_file():
        index = read_json(src / INDEX)
        (out / INDEX).write_text(json.dumps({**index, "weight_map": weight_map}, indent=2))
    write_quant_config(out, fmt, sorted(set(ignore) | kept))
    return out


def _quantize_file(
    tensors: dict[str, torch.Tensor],
    fmt: str,
    ignore: tuple[str, ...],
    kept: set[str],
    quantizer: Quantizer,
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        ok = t.is_floating_point() and t.dim() in (2, 3) and t.shape[-1] % BLOCK == 0
        if is_nvfp4_target(name) and ok and not matches(ignore, name):
            w = quantizer(name, t)
            packed, block, glob = stored_names(name, fmt)
            g = w.global_scale if fmt == MODELOPT else 1.0 / w.global_scale
            out[packed], out[block] = w.packed.contiguous(), w.block_scale.contiguous()
            out[glob] = g.float().reshape(-1 if t.dim() == 3 else ()).contiguous()
            continue
        linear, why = classify(name)
        if linear or why in UNQUANTIZED_LINEARS:  # a linear left in the compute dtype
            kept.add(module_names(name)[0])
        out[name] = t.contiguous()
    return out


def _input_scales(
    tensors: dict[str, torch.Tensor], fmt: str, input_amax: Callable[[str], torch.Tensor | None]
) -> dict[str, torch.Tensor]:
    """The input scales of the NVFP4 weights written to this file (those with a known amax)."""
    out = {}
    for name in [n for n in tensors if n.endswith(("_scale_2", "_global_scale"))]:
        weight = (
            name.removesuffix("_scale_2") if fmt == MODELOPT else name.removesuffix("_global_scale")
        )
        amax = input_amax(weight)
        if amax is None:
            continue
        scale = (amax.float() / (E2M1_MAX * FP8_MAX)).clamp_min(MIN_GLOBAL)
        base = weight.removesuffix("weight") if weight.endswith(".weight") else weight + "_"
        if fmt == MODELOPT:
            out[base + "input_scale"] = scale.contiguous()
        else:
            out[base + "input_global_scale"] = (1.0 / scale).contiguous()
    return out


def write_quant_config(out: Path, fmt: str, ignore: list[str]) -> None:
    """Declare an NVFP4 checkpoint at `out`: hf_quant_config.json (ModelOpt) or config.json's
    quantization_config (compressed-tensors), with `ignore` as its list of unquantized modules."""
    if fmt == MODELOPT:
        hf = {
            "producer": {"name": "modelopt", "version": "dlmrt"},
            "quantization": {
                "quant_algo": "NVFP4",
                "group_size": BLOCK,
                "kv_cache_quant_algo": None,
                "exclude_modules": ignore,
            },
        }
        (out / "hf_quant_config.json").write_text(json.dumps(hf, indent=2))
        return
    cfg = read_json(out / "config.json")
    weights = {
        "num_bits": 4,
        "type": "float",
        "strategy": "tensor_group",
        "group_size": BLOCK,
        "symmetric": True,
        "dynamic": False,
    }
    cfg["quantization_config"] = {
        "quant_method": COMPRESSED_TENSORS,
        "format": CT_NVFP4,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ignore,
        "kv_cache_scheme": None,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
