"""Nvfp4Reader: the NVFP4 tensors of a checkpoint, checked and collected while the weights stream in.

The reader `reader.quantized_reader` returns for an NVFP4 checkpoint (same interface: `take`, `weights`). The
stored names of a weight W (a model parameter `x.weight`, or a stacked `experts.gate_up_proj`):

  ModelOpt            W uint8 [.., N, K/2]   W_scale e4m3 [.., N, K/16]   W_scale_2 fp32 (global)
  compressed-tensors  x.weight_packed / experts.gate_up_proj_packed, `_scale` e4m3 as above,
                      `weight_global_scale` / `_global_scale` fp32 = 1 / (ModelOpt's global scale)

A global scale is a scalar ([] or [1]) or, for a stacked tensor, one per expert ([E], [E, 1]).
A weight's static input scale (ModelOpt `x.input_scale` / `W_input_scale`, compressed-tensors
`x.input_global_scale` / `W_input_global_scale` = its reciprocal) is kept on the Nvfp4Weight
(`input_scale`, ModelOpt's convention; a stacked weight's the largest expert's): dlmrt runs W4A16
and reads it only for `activations="nvfp4"` emulation. Other input scales are dropped.
`split` renames a packed weight to its parameter and gives it the unpacked shape [.., N, K], so the
loader's strict check is unchanged; `take` returns it dequantized (fp32) and keeps the Nvfp4Weight.
Each malformed tensor is a CheckpointError naming it and its file.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from dlmrt.errors import CheckpointError
from dlmrt.formats.fp8 import FP8
from dlmrt.formats.nvfp4 import BLOCK, Nvfp4Weight
from dlmrt.loading.policy import matches
from dlmrt.loading.quant_config import MODELOPT, QuantConfig

Found = dict[str, tuple[Path, tuple[int, ...]]]
INPUT_SCALES = (".input_scale", "_input_scale", ".input_global_scale", "_input_global_scale")
KV_SCALES = (".k_scale", ".v_scale", ".q_scale", ".prob_scale")


def stored_names(weight: str, method: str) -> tuple[str, str, str]:
    """(packed weight, block scale, global scale) stored names of parameter-side name `weight`."""
    if method == MODELOPT:
        return weight, weight + "_scale", weight + "_scale_2"
    return weight + "_packed", weight + "_scale", weight + "_global_scale"  # x.weight_packed ...


def _input_scale_name(weight: str, method: str, found: Found) -> str | None:
    """The stored static input scale of parameter-side `weight` when the checkpoint has one."""
    suffix = "input_scale" if method == MODELOPT else "input_global_scale"
    name = weight.removesuffix(".weight") + "." + suffix if weight.endswith(".weight") else None
    name = name or f"{weight}_{suffix}"
    return name if name in found else None


def _weight_of(name: str, found: Found, method: str) -> str | None:
    """The parameter-side weight name if `name` is a stored NVFP4 weight, else None."""
    if method == MODELOPT:
        return name if name + "_scale" in found or name + "_scale_2" in found else None
    return name.removesuffix("_packed") if name.endswith("_packed") else None


class Nvfp4Reader:
    """Built by `split`; `take` each streamed tensor; `weights(params)` the collected weights."""

    def __init__(
        self,
        qcfg: QuantConfig,
        aux: dict[str, tuple],
        source: dict[str, str],
        slices: dict[str, tuple[str, int]],
    ) -> None:
        self.qcfg, self.aux, self.source, self.slices = qcfg, aux, source, slices
        self.ignore = qcfg.ignore
        self.kept: dict[str, Nvfp4Weight] = {}
        self.parts: dict[str, dict[int, Nvfp4Weight]] = {}

    @classmethod
    def split(
        cls,
        found: Found,
        source: dict[str, str],
        qcfg: QuantConfig,
        slices: dict[str, tuple[str, int]],
    ) -> tuple[Found, Nvfp4Reader]:
        """(the tensors the model must hold, unpacked shapes; a reader holding the scales)."""
        weights = {w: n for n in found if (w := _weight_of(n, found, qcfg.method)) is not None}
        aux_names: dict[str, tuple[str, str]] = {}
        for weight, packed in weights.items():
            _, block, glob = stored_names(weight, qcfg.method)
            for what, name in (("block scale", block), ("global scale", glob)):
                if name not in found:
                    raise CheckpointError(
                        f"{found[packed][0]}: NVFP4 weight '{source[packed]}' has no {what} "
                        f"(expected a tensor '{name}')"
                    )
            aux_names[weight] = (block, glob, _input_scale_name(weight, qcfg.method, found))
            _check_packed_shape(found, source, packed, block)
        taken = set(weights.values()) | {n for aux in aux_names.values() for n in aux if n}
        rest: Found = {}
        for name, entry in found.items():
            if name in taken or name.endswith(INPUT_SCALES + KV_SCALES):
                continue
            rest[name] = entry
        for weight, packed in weights.items():
            f, shape = found[packed]
            rest[weight] = (f, (*shape[:-1], 2 * shape[-1]))  # the parameter's [.., N, K]
            source[weight] = source[packed]
        return rest, cls(qcfg, _read_aux(found, source, aux_names), source, slices)

    def take(self, name: str, f: Path, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` unchanged when it is not an NVFP4 weight; else keep it, return it dequantized."""
        stored = self.source[name]
        if name not in self.aux:
            if tensor.dtype in (torch.uint8, FP8):
                raise CheckpointError(
                    f"{f}: tensor '{stored}' has dtype {str(tensor.dtype).removeprefix('torch.')} "
                    "but no NVFP4 block scale (expected a tensor "
                    f"'{stored_names(name, self.qcfg.method)[1]}')"
                )
            return tensor
        return self.keep(name, f, tensor).dequantize(torch.float32)

    def keep(self, name: str, f: Path, tensor: torch.Tensor) -> Nvfp4Weight:
        """Check and keep the NVFP4 weight `name` (its packed codes `tensor`), never dequantized:
        what a weight whose parameter is not allocated takes (`loading/deferred.py`)."""
        stored = self.source[name]
        pattern = matches(self.ignore, stored)
        if pattern is not None:
            raise CheckpointError(
                f"{f}: tensor '{stored}' is NVFP4 but its module is in the ignore list "
                f"('{pattern}' in {self.qcfg.source.name})"
            )
        weight = _build(name, stored, f, tensor, self.aux[name], self.qcfg.method)
        if name in self.slices:
            param, index = self.slices[name]
            self.parts.setdefault(param, {})[index] = weight
        else:
            self.kept[name] = weight
        return weight

    def weights(self, params: dict[str, torch.Tensor]) -> dict[str, Nvfp4Weight]:
        """Every NVFP4 weight by parameter name; a stacked parameter's experts stacked."""
        out = dict(self.kept)
        for param, parts in self.parts.items():
            experts = params[param].shape[0]
            if len(parts) != experts:
                raise CheckpointError(
                    f"{param}: {len(parts)} of its {experts} stored experts are NVFP4; all or none "
                    "must be"
                )
            ws = [parts[e] for e in range(experts)]
            inputs = [w.input_scale for w in ws]
            out[param] = Nvfp4Weight(
                torch.stack([w.packed for w in ws]),
                torch.stack([w.block_scale for w in ws]),
                torch.stack([w.global_scale for w in ws]),
                None if any(s is None for s in inputs) else torch.stack(inputs).amax(),
            )
        return out


def _check_packed_shape(found: Found, source: dict[str, str], packed: str, block: str) -> None:
    """Two codes a byte, one block scale per 16: packed [.., N, K/2] goes with block [.., N, K/16]."""
    (f, shape), (_, bshape) = found[packed], found[block]
    want = (*bshape[:-1], 8 * bshape[-1]) if bshape else None
    if tuple(shape) != want:
        raise CheckpointError(
            f"{f}: NVFP4 weight '{source[packed]}' has packed shape {list(shape)}, expected "
            f"{list(want or ())} for its block scale '{source[block]}' {list(bshape)} "
            "(two E2M1 codes a byte, one scale per 16)"
        )


def _read_aux(
    found: Found, source: dict[str, str], names: dict[str, tuple[str, str, str | None]]
) -> dict[str, tuple]:
    """weight -> (file, block scale, global scale, input scale or None) read from the files
    (scales are small; each file opened once)."""
    wanted = {n for triple in names.values() for n in triple if n is not None}
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(found[name][0], []).append(name)
    got: dict[str, torch.Tensor] = {}
    for f, tensors in by_file.items():
        with safe_open(str(f), framework="pt", device="cpu") as st:
            got |= {n: st.get_tensor(source[n]) for n in tensors}
    return {
        w: (found[block][0], got[block], got[glob], None if inp is None else got[inp])
        for w, (block, glob, inp) in names.items()
    }


def _build(
    name: str, stored: str, f: Path, packed: torch.Tensor, aux: tuple, method: str
) -> Nvfp4Weight:
    """Check one stored NVFP4 weight's dtypes and shapes; its Nvfp4Weight (ModelOpt's scales)."""
    _, block, glob, inp = aux
    block_name, glob_name = stored_names(name, method)[1:]
    if packed.dtype != torch.uint8:
        raise CheckpointError(
            f"{f}: NVFP4 weight '{stored}' has dtype {str(packed.dtype).removeprefix('torch.')}, "
            "expected uint8 (two E2M1 codes per byte)"
        )
    rows, k = tuple(packed.shape[:-1]), 2 * packed.shape[-1]
    if packed.dim() not in (2, 3) or k % BLOCK:
        raise CheckpointError(
            f"{f}: NVFP4 weight '{stored}' has packed shape {list(packed.shape)}: expected "
            f"[N, K/2] or [E, N, K/2] with K a multiple of {BLOCK}"
        )
    if block.dtype != FP8 or tuple(block.shape) != (*rows, k // BLOCK):
        raise CheckpointError(
            f"{f}: NVFP4 block scale '{block_name}' is {str(block.dtype).removeprefix('torch.')} "
            f"{list(block.shape)}, expected float8_e4m3fn {[*rows, k // BLOCK]} for the packed "
            f"weight '{stored}' {list(packed.shape)}"
        )
    experts = rows[0] if len(rows) == 2 else None
    allowed = [(), (1,)] if experts is None else [(), (1,), (experts,), (experts, 1)]
    if not glob.is_floating_point() or tuple(glob.shape) not in allowed:
        raise CheckpointError(
            f"{f}: NVFP4 global scale '{glob_name}' is {str(glob.dtype).removeprefix('torch.')} "
            f"{list(glob.shape)}, expected float32 of shape one of {[list(s) for s in allowed]}"
        )
    g = glob.float().reshape(-1)
    g = g.expand(experts).contiguous() if experts is not None else g[0]
    if method != MODELOPT:
        g = 1.0 / g  # compressed-tensors stores the reciprocal (w = code * scale / global)
    return Nvfp4Weight(packed, block, g, _input_scale(f, stored, inp, allowed, method))


def _input_scale(
    f: Path, stored: str, inp: torch.Tensor | None, allowed: list, method: str
) -> torch.Tensor | None:
    """A weight's input scale as ModelOpt's fp32 [] (per expert: the largest), or None."""
    if inp is None:
        return None
    if not inp.is_floating_point() or tuple(inp.shape) not in allowed:
        raise CheckpointError(
            f"{f}: the NVFP4 input scale of '{stored}' is {str(inp.dtype).removeprefix('torch.')} "
            f"{list(inp.shape)}, expected float32 of shape one of {[list(s) for s in allowed]}"
        )
    scale = inp.float().reshape(-1)
    return (scale if method == MODELOPT else 1.0 / scale).amax()
