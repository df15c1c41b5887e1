"""The quantized tensors of a checkpoint (`quantized_reader`: FP8 here, NVFP4 in `nvfp4_reader.py`),
and `Fp8Reader`: the FP8 tensors of a checkpoint, checked and collected while the weights stream in.

`split` takes the scale tensors out of the checkpoint's tensor list before the loader's strict
name/shape check (a weight `W` has its scale in `W_scale`: `x.weight_scale`, or
`experts.gate_up_proj_scale` for a stacked expert tensor, or `W_scale_inv` for transformers'
block-scaled "fp8"; static input scales `x.input_scale` and KV
scales `*.k_scale` / `*.v_scale` are dropped: dlmrt quantizes activations per row at run time). Then
`take` is called on every tensor read: an FP8 weight becomes an `Fp8Weight` (kept) and its float32
dequantization (what the loader copies into the parameter). Each bad FP8 tensor is a CheckpointError
naming the tensor and the file: a wrong dtype, a missing scale, a scale of the wrong shape, an FP8
tensor in the ignore list, an FP8 tensor in a checkpoint that declares no quantization. Block
scales (a declared `block`) are re-rounded per output channel (`block_fp8.py`), logged once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from dlmrt.errors import CheckpointError
from dlmrt.formats.block_fp8 import block_grid, to_per_channel
from dlmrt.formats.fp8 import FP8, Fp8Weight
from dlmrt.loading.policy import matches
from dlmrt.loading.quant_config import QuantConfig

KV_SCALES = (".k_scale", ".v_scale", ".q_scale", ".prob_scale")
Found = dict[str, tuple[Path, tuple[int, ...]]]
SCALE_SUFFIXES = ("_scale_inv", "_scale")  # transformers' block "fp8"; everyone else

log = logging.getLogger("dlmrt")


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _is_8bit_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.element_size() == 1


class Fp8Reader:
    """Built by `split`; `take` each streamed tensor; `weights(params)` the collected FP8 weights."""

    def __init__(
        self,
        qcfg: QuantConfig | None,
        scales: dict[str, tuple[Path, str, torch.Tensor]],
        source: dict[str, str],
        slices: dict[str, tuple[str, int]],
    ) -> None:
        self.qcfg, self.scales, self.source, self.slices = qcfg, scales, source, slices
        self.ignore = () if qcfg is None else qcfg.ignore
        self.kept: dict[str, Fp8Weight] = {}
        self.parts: dict[str, dict[int, Fp8Weight]] = {}
        self.rerounded = 0  # block-scaled weights re-rounded per channel

    @classmethod
    def split(
        cls,
        found: Found,
        source: dict[str, str],
        qcfg: QuantConfig | None,
        slices: dict[str, tuple[str, int]],
    ) -> tuple[Found, Fp8Reader]:
        """(the tensors the model must hold, a reader holding the scales read from the files)."""
        if qcfg is None:
            return found, cls(None, {}, source, slices)
        rest, scale_names, dropped = {}, {}, 0
        for name, entry in found.items():
            suffix = next((x for x in SCALE_SUFFIXES if name.endswith(x)), None)
            base = name.removesuffix(suffix) if suffix else name
            if suffix and base in found:
                scale_names[base] = name
            elif _input_scale_of(name) in found or name.endswith(KV_SCALES):
                dropped += 1
            else:
                rest[name] = entry
        by_file: dict[Path, list[str]] = {}
        for weight, name in scale_names.items():
            by_file.setdefault(found[name][0], []).append(weight)
        scales = {}
        for f, weights in by_file.items():
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for w in weights:
                    scales[w] = (f, source[scale_names[w]], st.get_tensor(source[scale_names[w]]))
        return rest, cls(qcfg, scales, source, slices)

    def take(self, name: str, f: Path, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` unchanged when it is not an FP8 weight; else keep it and return it dequantized."""
        has_scale = name in self.scales
        if not has_scale and not _is_8bit_float(tensor):
            return tensor
        stored = self.source[name]
        if self.qcfg is None:
            raise CheckpointError(
                f"{f}: tensor '{stored}' has dtype {_dtype(tensor)} but the checkpoint declares no "
                "quantization (config.json quantization_config or hf_quant_config.json)"
            )
        if not has_scale:
            raise CheckpointError(
                f"{f}: FP8 tensor '{stored}' has no scale (expected a tensor '{stored}_scale'"
                + (f" or '{stored}_scale_inv')" if self.qcfg.block else ")")
            )
        if tensor.dtype != FP8:
            raise CheckpointError(
                f"{f}: tensor '{stored}' has dtype {_dtype(tensor)}, expected float8_e4m3fn "
                f"(it has the scale '{self.scales[name][1]}')"
            )
        pattern = matches(self.ignore, stored)
        if pattern is not None:
            raise CheckpointError(
                f"{f}: tensor '{stored}' is FP8 but its module is in the ignore list "
                f"('{pattern}' in {self.qcfg.source.name})"
            )
        weight = self._weight(name, tensor)
        if name in self.slices:
            param, index = self.slices[name]
            self.parts.setdefault(param, {})[index] = weight
        else:
            self.kept[name] = weight
        return weight.dequantize(torch.float32)

    def _weight(self, name: str, tensor: torch.Tensor) -> Fp8Weight:
        """The stored codes with their scale: per channel as stored, or block scales re-rounded."""
        _, _, scale = self.scales[name]
        block = self.qcfg.block if self.qcfg is not None else None
        if block is not None and scale.dim() == tensor.dim() and scale.dim() >= 2:
            if tuple(scale.shape) == block_grid(tuple(tensor.shape), block):
                if self.rerounded == 0:
                    log.info(
                        "block-scaled FP8 (%dx%d): weights re-rounded per output channel "
                        "at load (dlmrt's kernels take per-channel scales)",
                        *block,
                    )
                self.rerounded += 1
                return to_per_channel(tensor, self._float_scale(name), block)
        return Fp8Weight(tensor, self._row_scale(name, tensor))

    def _float_scale(self, name: str) -> torch.Tensor:
        f, stored, scale = self.scales[name]
        if not scale.is_floating_point() or scale.element_size() == 1:
            raise CheckpointError(
                f"{f}: scale '{stored}' has dtype {_dtype(scale)}, expected float32 (or bf16/fp16)"
            )
        return scale.float()

    def _row_scale(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The stored scale as float32 [N] / [E, N]: per tensor ([] / [1]), per expert ([E],
        [E, 1], [E, 1, 1]) or per channel ([N] / [N, 1], [E, N] / [E, N, 1])."""
        f, stored, _ = self.scales[name]
        scale = self._float_scale(name)
        rows = tuple(tensor.shape[:-1])
        shape = tuple(scale.shape)
        allowed = [(), (1,), rows, rows + (1,)]
        if len(rows) == 2:
            allowed += [rows[:1], (rows[0], 1), (rows[0], 1, 1)]
        if self.qcfg is not None and self.qcfg.block is not None:
            allowed.append(block_grid(tuple(tensor.shape), self.qcfg.block))
        if shape not in allowed:
            raise CheckpointError(
                f"{f}: scale '{stored}' has shape {list(shape)}, expected one of "
                f"{[list(s) for s in allowed]} for the FP8 weight '{self.source[name]}' of shape "
                f"{list(tensor.shape)}"
            )
        if shape in ((rows[0], 1, 1), (rows[0],)) and len(rows) == 2:
            scale = scale.reshape(rows[0], 1)  # per expert
        elif shape == rows + (1,):
            scale = scale.squeeze(-1)
        return scale.expand(rows).contiguous()

    def weights(self, params: dict[str, torch.Tensor]) -> dict[str, Fp8Weight]:
        """Every FP8 weight by parameter name; a stacked parameter's experts stacked [E, N, K]."""
        out = dict(self.kept)
        for param, parts in self.parts.items():
            experts = params[param].shape[0]
            if len(parts) != experts:
                stored = [s for s, (p, _) in self.slices.items() if p == param]
                raise CheckpointError(
                    f"{param}: {len(parts)} of its {experts} stored experts are FP8 "
                    f"(e.g. '{stored[0]}'); all or none must be"
                )
            out[param] = Fp8Weight(
                torch.stack([parts[e].qweight for e in range(experts)]),
                torch.stack([parts[e].scale for e in range(experts)]),
            )
        return out


def quantized_reader(
    found: Found,
    source: dict[str, str],
    qcfg: QuantConfig | None,
    slices: dict[str, tuple[str, int]],
) -> tuple[Found, Any]:
    """(the tensors the model must hold, the reader of the checkpoint's quantized weights): an
    `Nvfp4Reader` (`nvfp4_reader.py`) for the "nvfp4" scheme, else an `Fp8Reader` (one that
    finds nothing when the checkpoint declares no quantization). Both answer `take`, `weights`,
    `ignore`, `source` and `slices`."""
    if qcfg is not None and qcfg.scheme == "nvfp4":
        from dlmrt.loading.nvfp4_reader import Nvfp4Reader

        return Nvfp4Reader.split(found, source, qcfg, slices)
    return Fp8Reader.split(found, source, qcfg, slices)


def _input_scale_of(name: str) -> str | None:
    """The weight a static input scale belongs to: `x.input_scale` -> `x.weight`,
    `e.gate_up_proj_input_scale` -> `e.gate_up_proj`; None for any other name."""
    if name.endswith(".input_scale"):
        return name.removesuffix(".input_scale") + ".weight"
    if name.endswith("_input_scale"):
        return name.removesuffix("_input_scale")
    return None
