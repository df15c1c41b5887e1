"""QuantConfig: the FP8 scheme a checkpoint declares, read from its config files.

Two formats (docs/quantization.md):
- compressed-tensors (llm-compressor): `config.json` `quantization_config` with `quant_method:
  "compressed-tensors"`, format `float-quantized` (or `naive-quantized`), config groups whose
  `weights` are 8-bit floats, strategy `channel` or `tensor`, symmetric; `ignore` lists modules
  kept unquantized (names, or `re:` regexes).
- NVIDIA ModelOpt: `hf_quant_config.json` `{"producer": {"name": "modelopt"}, "quantization":
  {"quant_algo": "FP8" | "FP8_PER_CHANNEL_PER_TOKEN", "exclude_modules": [...]}}`, or the newer
  `quantization_config` in config.json with `quant_method: "modelopt"` (`ignore`).
Anything else that declares a quantization (NVFP4, block-scaled FP8, int4 ...) is refused with a
CheckpointError naming the file and the value, never loaded as if it were bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmrt.errors import CheckpointError
from dlmrt.json_file import read_json

COMPRESSED_TENSORS, MODELOPT = "compressed-tensors", "modelopt"
CT_FORMATS = ("float-quantized", "naive-quantized")
MODELOPT_ALGOS = {"FP8": "tensor", "FP8_PER_CHANNEL_PER_TOKEN": "channel"}
STRATEGIES = ("channel", "tensor")


@dataclass(frozen=True)
class QuantConfig:
    """method: compressed-tensors | modelopt; source: the file that declared it; ignore: module
    patterns kept unquantized; strategy: the declared weight-scale granularity (channel | tensor;
    the reader accepts either shape of scale); kv_cache: the declared KV-cache quantization, if any
    (informational: dlmrt computes its own KV scales)."""

    method: str
    source: Path
    ignore: tuple[str, ...] = ()
    strategy: str = "channel"
    kv_cache: str | None = None


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
        raise CheckpointError(
            f"{cfg_path}: unsupported quantization_config.quant_method {qc.get('quant_method')!r} "
            f"(dlmrt reads FP8 checkpoints in the {COMPRESSED_TENSORS} and {MODELOPT} formats)"
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
    ignore = _string_list(q.get("exclude_modules", q.get("ignore")), "exclude_modules", path)
    kv = q.get("kv_cache_quant_algo")
    return QuantConfig(
        MODELOPT, path, ignore, MODELOPT_ALGOS[algo], None if kv is None else str(kv)
    )


def _compressed_tensors(qc: dict[str, Any], path: Path) -> QuantConfig:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError(f"{path}: quantization_config has no 'config_groups'")
    strategies = {_ct_group(name, g, qc.get("format"), path) for name, g in groups.items()}
    ignore = _string_list(qc.get("ignore"), "ignore", path)
    kv = qc.get("kv_cache_scheme")
    kv_name = None if kv is None else f"{kv.get('type', '?')}{kv.get('num_bits', '?')}"
    strategy = "channel" if "channel" in strategies else "tensor"
    return QuantConfig(COMPRESSED_TENSORS, path, ignore, strategy, kv_name)


def _ct_group(name: str, group: Any, top_format: Any, path: Path) -> str:
    """One config group's weight strategy, after checking it is symmetric 8-bit float."""
    where = f"{path}: quantization_config.config_groups.{name}"
    if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
        raise CheckpointError(f"{where}: missing 'weights'")
    fmt = group.get("format", top_format)
    if fmt not in CT_FORMATS:
        raise CheckpointError(
            f"{where}: unsupported compressed-tensors format {fmt!r} "
            f"(dlmrt reads FP8 {' / '.join(CT_FORMATS)})"
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
