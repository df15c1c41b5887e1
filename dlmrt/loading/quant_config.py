"""QuantConfig: the FP8 scheme a checkpoint declares, read from its config files.

Two formats (docs/quantization.md):
- compressed-tensors (llm-compressor): `config.json` `quantization_config` with `quant_method:
  "compressed-tensors"`, format `float-quantized` (or `naive-quantized`), config groups whose
  `weights` are 8-bit floats, strategy `channel` or `tensor`, symmetric; `ignore` lists modules
  kept unquantized (names, or `re:` regexes).
- NVIDIA ModelOpt: `hf_quant_config.json` `{"producer": {"name": "modelopt"}, "quantization":
  {"quant_algo": "FP8" | "FP8_PER_CHANNEL_PER_TOKEN", "exclude_modules": [...]}}`, or the newer
  `quantization_config` in config.json with `quant_method: "modelopt"` (`ignore`).
NVFP4 (`quant_algo: "NVFP4"`; compressed-tensors format `nvfp4-pack-quantized`, 4-bit float weights,
strategy `tensor_group`, group_size 16) has scheme "nvfp4" (`nvfp4.py`, `nvfp4_reader.py`).
Anything else that declares a quantization (block-scaled FP8, int4 ...) is refused with a
CheckpointError naming the file and the value, never loaded as if it were bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmrt.errors import CheckpointError
from dlmrt.json_file import read_json

COMPRESSED_TENSORS, MODELOPT = "compressed-tensors", "modelopt"
# transformers' FineGrainedFP8 (DeepSeek-V3, Qwen3-FP8): e4m3 with `weight_scale_inv` blocks
FINEGRAINED = "fp8"
CT_FORMATS = ("float-quantized", "naive-quantized")
CT_NVFP4 = "nvfp4-pack-quantized"
MODELOPT_ALGOS = {"FP8": "tensor", "FP8_PER_CHANNEL_PER_TOKEN": "channel", "NVFP4": "group"}
STRATEGIES = ("channel", "tensor", "block")
FP8_KV_NAMES = ("FP8", "float8")  # ModelOpt kv_cache_quant_algo; compressed-tensors kv_cache_scheme


@dataclass(frozen=True)
class QuantConfig:
    """method: compressed-tensors | modelopt; source: the file that declared it; ignore: module
    patterns kept unquantized; strategy: the declared weight-scale granularity (channel | tensor |
    block; the reader accepts any of the shapes); kv_cache: the declared KV-cache quantization, if
    any (informational: dlmrt computes its own KV scales); scheme: fp8 | nvfp4 (strategy "group");
    block: the [rows, columns] of one weight scale when strategy is "block" (`block_fp8.py`)."""

    method: str
    source: Path
    ignore: tuple[str, ...] = ()
    strategy: str = "channel"
    kv_cache: str | None = None
    scheme: str = "fp8"
    block: tuple[int, int] | None = None

    @property
    def fp8_kv_cache(self) -> bool:
        """The files declare an FP8 KV cache. It does not switch kv_cache_dtype "auto" to FP8,
        as in vLLM: the FP8 arena is slower on Hopper today (docs/quantization.md); dlmrt keeps
        its own KV scale."""
        return self.kv_cache in FP8_KV_NAMES


def read_quant_config(root: Path, raw: dict[str, Any]) -> QuantConfig | None:
    """The checkpoint's FP8 scheme, or None for an unquantized checkpoint.

    config.json's `quantization_config` wins over a `hf_quant_config.json` beside it."""
    cfg_path = root / "config.json"
    qc = raw.get("quantization_config") or raw.get("compression_config")
    if qc is None and isinstance(raw.get("text_config"), dict):
        qc = raw["text_config"].get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise CheckpointError(f"{cfg_path}: 'quantization_config' must be an object")
        method = str(qc.get("quant_method", "")).replace("_", "-")
        if method == COMPRESSED_TENSORS:
            return _compressed_tensors(qc, cfg_path)
        if method == MODELOPT:
            return _modelopt(qc.get("quantization", qc), cfg_path)
        if method == FINEGRAINED:
            return _finegrained(qc, cfg_path)
        raise CheckpointError(
            f"{cfg_path}: unsupported quantization_config.quant_method {qc.get('quant_method')!r} "
            f"(dlmrt reads FP8 checkpoints in the {COMPRESSED_TENSORS}, {MODELOPT} and "
            f"'{FINEGRAINED}' (block-scaled) formats)"
        )
    hf_path = root / "hf_quant_config.json"
    hf = read_json(hf_path, required=False)
    if hf is None:
        return None
    if not isinstance(hf.get("quantization"), dict):
        raise CheckpointError(f"{hf_path}: missing the 'quantization' object")
    return _modelopt(hf["quantization"], hf_path)


def _string_list(value: Any, what: str, path: Path) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{path}: '{what}' must be a list of module names")
    return tuple(value)


def _modelopt(q: dict[str, Any], path: Path) -> QuantConfig:
    algo = q.get("quant_algo")
    if algo not in MODELOPT_ALGOS:
        raise CheckpointError(
            f"{path}: unsupported ModelOpt quant_algo {algo!r} "
            f"(dlmrt reads {', '.join(MODELOPT_ALGOS)})"
        )
    if algo == "NVFP4" and q.get("group_size", 16) != 16:
        raise CheckpointError(
            f"{path}: NVFP4 group_size {q.get('group_size')!r} is not supported (expected 16)"
        )
    ignore = _string_list(q.get("exclude_modules", q.get("ignore")), "exclude_modules", path)
    kv = q.get("kv_cache_quant_algo")
    scheme = "nvfp4" if algo == "NVFP4" else "fp8"
    kv_name = None if kv is None else str(kv)
    return QuantConfig(MODELOPT, path, ignore, MODELOPT_ALGOS[algo], kv_name, scheme)


def _block_size(value: Any, what: str, path: Path) -> tuple[int, int]:
    """A [rows, columns] scale block: two positive integers."""
    ok = isinstance(value, list) and len(value) == 2
    if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise CheckpointError(f"{path}: '{what}' must be two positive integers, got {value!r}")
    return value[0], value[1]


def _finegrained(qc: dict[str, Any], path: Path) -> QuantConfig:
    """transformers' `quant_method: "fp8"`: e4m3 weights, one `weight_scale_inv` (a multiplier,
    despite its name) per `weight_block_size` tile, activations quantized at run time."""
    if qc.get("fmt", "e4m3") != "e4m3":
        raise CheckpointError(f"{path}: FP8 fmt {qc.get('fmt')!r} is not supported (expected e4m3)")
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        raise CheckpointError(
            f"{path}: activation_scheme {qc.get('activation_scheme')!r} is not supported "
            "(dlmrt quantizes activations at run time: expected 'dynamic')"
        )
    block = _block_size(qc.get("weight_block_size"), "weight_block_size", path)
    ignore = _string_list(qc.get("modules_to_not_convert"), "modules_to_not_convert", path)
    return QuantConfig(FINEGRAINED, path, ignore, "block", None, "fp8", block)


def _compressed_tensors(qc: dict[str, Any], path: Path) -> QuantConfig:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError(f"{path}: quantization_config has no 'config_groups'")
    strategies = {_ct_group(name, g, qc.get("format"), path) for name, g in groups.items()}
    ignore = _string_list(qc.get("ignore"), "ignore", path)
    kv = qc.get("kv_cache_scheme")
    kv_name = None if kv is None else f"{kv.get('type', '?')}{kv.get('num_bits', '?')}"
    if "group" in strategies and len(strategies) > 1:
        raise CheckpointError(f"{path}: config_groups mix NVFP4 and FP8 weights (not supported)")
    order = ("group", "block", "channel", "tensor")
    strategy = next(s for s in order if s in strategies or s == "tensor")
    scheme = "nvfp4" if strategy == "group" else "fp8"
    block = None
    if strategy == "block":  # every block group must name the same block
        found = {
            _block_size(
                g["weights"].get("block_structure"), f"{name}.weights.block_structure", path
            )
            for name, g in groups.items()
            if g["weights"].get("strategy") == "block"
        }
        if len(found) > 1:
            raise CheckpointError(f"{path}: config_groups use different block_structure {found}")
        block = found.pop()
    return QuantConfig(COMPRESSED_TENSORS, path, ignore, strategy, kv_name, scheme, block)


def _ct_group(name: str, group: Any, top_format: Any, path: Path) -> str:
    """One config group's weight strategy, after checking it is symmetric 8-bit float."""
    where = f"{path}: quantization_config.config_groups.{name}"
    if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
        raise CheckpointError(f"{where}: missing 'weights'")
    fmt = group.get("format", top_format)
    if fmt == CT_NVFP4:
        return _ct_nvfp4(group.get("weights"), where)
    if fmt not in CT_FORMATS:
        raise CheckpointError(
            f"{where}: unsupported compressed-tensors format {fmt!r} "
            f"(dlmrt reads FP8 {' / '.join(CT_FORMATS)} and {CT_NVFP4})"
        )
    w = group["weights"]
    if w.get("type") != "float" or w.get("num_bits") != 8:
        raise CheckpointError(
            f"{where}.weights: {w.get('type')!r} {w.get('num_bits')!r}-bit weights are not FP8 "
            "(expected type 'float', num_bits 8)"
        )
    if w.get("strategy") not in STRATEGIES:
        raise CheckpointError(
            f"{where}.weights: unsupported strategy {w.get('strategy')!r} "
            f"(expected {' or '.join(STRATEGIES)})"
        )
    if w.get("symmetric") is False:
        raise CheckpointError(f"{where}.weights: asymmetric FP8 (zero points) is not supported")
    return w["strategy"]


def _ct_nvfp4(w: dict[str, Any], where: str) -> str:
    """An NVFP4 group's weights: 4-bit floats, one scale per 16 (`tensor_group`), symmetric."""
    if w.get("type") != "float" or w.get("num_bits") != 4:
        raise CheckpointError(
            f"{where}.weights: {w.get('type')!r} {w.get('num_bits')!r}-bit weights are not NVFP4 "
            "(expected type 'float', num_bits 4)"
        )
    if w.get("strategy") != "tensor_group" or w.get("group_size") != 16:
        raise CheckpointError(
            f"{where}.weights: NVFP4 strategy {w.get('strategy')!r} group_size "
            f"{w.get('group_size')!r} is not supported (expected 'tensor_group', 16)"
        )
    if w.get("symmetric") is False:
        raise CheckpointError(f"{where}.weights: asymmetric NVFP4 (zero points) is not supported")
    return "group"
