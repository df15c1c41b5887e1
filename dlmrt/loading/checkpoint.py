"""Load an HF-format checkpoint directory: config.json -> family -> model, weights streamed in.

Strict: an unsupported architecture, a missing/unexpected/wrongly shaped tensor, a missing or
out-of-range config field (sizes >= 1, stop ids in the vocabulary), an integer or bool tensor where
a float weight belongs, or an unreadable file raises `CheckpointError` naming the file and the
tensor or field. Headers are checked before any weight is read (`tensors.py`); the model is built
on the meta device, allocated once, and filled one tensor at a time, so the weights are never held
twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from dlmrt import envs, models
from dlmrt.errors import CheckpointError
from dlmrt.formats.fp8 import Fp8Weight
from dlmrt.formats.nvfp4 import E2M1_MAX, Nvfp4Weight
from dlmrt.impls.deepgemm_install import install_deepgemm
from dlmrt.impls.glu_install import install_bf16_glu
from dlmrt.json_file import read_json
from dlmrt.loading.deferred import allocate, deferrable, finish
from dlmrt.loading.placement import (
    check_prefer,
    collect_quantized,
    installs_quantized,
    place_quantized,
)
from dlmrt.loading.quant_config import QuantConfig, read_quant_config
from dlmrt.loading.reader import quantized_reader
from dlmrt.loading.tensors import (
    check_layer_count,
    check_tensors,
    expand_slices,
    map_names,
    tensor_shapes,
    weight_files,
)
from dlmrt.loading.weight_check import FiniteCheck
from dlmrt.models.config import eos_ids

log = logging.getLogger("dlmrt")


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (eval mode, on its device) and its files, each parsed once
    here (the tokenizer and the decoding styles read these, never the files again)."""

    path: Path
    model: torch.nn.Module
    config: Any  # the family's frozen config dataclass
    config_json: dict[str, Any]  # config.json as read
    generation_config: dict[str, Any]  # generation_config.json as read ({}: none)
    quant_config: QuantConfig | None = None  # the quantization the files declare (None: none)
    # its quantized weights as they run (Fp8Weight / Nvfp4Weight, dlmrt/formats/)
    quantized: dict[str, Fp8Weight | Nvfp4Weight] = field(default_factory=dict)

    @classmethod
    def of_model(cls, model: torch.nn.Module, path: Path) -> Checkpoint:
        """A live model (the trainer's, its current weights) with the files of its directory
        `path` (each optional: a directory without them gives {})."""
        raw = read_json(path / "config.json", required=False) or {}
        gen = read_json(path / "generation_config.json", required=False) or {}
        return cls(path, model, model.cfg, raw, gen)


def load_checkpoint(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    *,
    check_finite: bool = True,
    quantization: str | None = None,
    shard: Callable[[torch.nn.Module], Any] | None = None,  # TP: dlmrt/distributed/loading.py
    activations: str = "none",
    prefer: str = "speed",
) -> Checkpoint:
    """Load `path` (an HF-format directory) into the registered family's model.

    check_finite: every floating-point tensor, as stored in `dtype` on `device`, must be free of
    NaN/Inf (else a CheckpointError names the first bad tensor); False skips the check.
    quantization: None runs an FP8 checkpoint's FP8 weights in FP8, "fp8" also quantizes the other
    candidates at load, "none" dequantizes everything (`dlmrt/quant/`, docs/quantization.md).
    activations: "nvfp4" emulates W4A4 on the NVFP4 experts and dense MLPs (loading/placement.py).
    prefer: "speed" runs each quantized site as measured, "memory" keeps NVFP4 experts and dense
    MLPs 4-bit (W4A16); NVFP4 weights bound for the kernels are never allocated (`deferred.py`)."""
    check_prefer(prefer)
    root = _directory(Path(path))
    cfg_path = root / "config.json"
    raw = read_json(cfg_path)
    arch, (model_cls, parse) = _architecture(raw, cfg_path)
    config, qcfg = parse(raw, cfg_path), read_quant_config(root, raw)
    gen_path = root / "generation_config.json"
    gen_cfg = read_json(gen_path, required=False) or {}
    eos_ids(gen_cfg.get("eos_token_id"), gen_path, config.vocab_size)  # stop ids in the vocabulary

    rename = getattr(model_cls, "checkpoint_name", None)
    found, source = map_names(tensor_shapes(weight_files(root)), rename, root)
    check_layer_count(getattr(config, "num_hidden_layers", None), found, cfg_path)
    with torch.device("meta"):
        model = model_cls(config).to(dtype)  # free on meta: the one allocation below is in `dtype`
    expected = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    reader = shard(model) if shard is not None else None  # reshapes the meta model, reads slices
    slices = model.checkpoint_slices() if hasattr(model, "checkpoint_slices") else {}
    expected = expand_slices(expected, slices)
    found, qreader = quantized_reader(found, source, qcfg, slices)
    tied = check_tensors(expected, found, config.tie_word_embeddings, root)

    installs = reader is None and installs_quantized(model, device, quantization, activations)
    deferred = deferrable(qreader) if installs else set()
    model = allocate(model, device, deferred)
    if tied:
        model.tie_lm_head()
    finite = FiniteCheck() if check_finite else None
    args = (found, source, slices, root, finite, qreader, reader, deferred)
    _stream_weights(model.state_dict(), *args)
    if finite is not None:
        finite.raise_if_bad(dtype)
    quantized, why = collect_quantized(qreader, model.state_dict(), quantization)
    model.eval().requires_grad_(False)
    _implementations(model, quantized, why, device, activations, prefer)
    _log_loaded(root, arch, config, tied, device, dtype, qcfg)
    return Checkpoint(root, model, config, raw, gen_cfg, qcfg, quantized)


def _implementations(model, quantized, why, device, activations, prefer) -> None:
    """The loaded model's implementation objects (dlmrt/impls): projections stacked, the quantized
    weights on their kernels where they run (the deferred ones placed), then the one-kernel
    gate|up + activation of the dense MLPs left in the model dtype where it is chosen, and the
    bf16 projections left on DeepGEMM where it is installed and faster."""
    if hasattr(model, "fuse_projections"):
        model.fuse_projections()
    place_quantized(model, quantized, why, device, activations, prefer)
    finish(model, device)  # the deferred parameters emptied by the install onto `device`
    if hasattr(model, "fuse_projections"):
        install_bf16_glu(model)
        install_deepgemm(model)


def _log_loaded(root, arch, config, tied, device, dtype, qcfg) -> None:
    residual = ", ORL residual" if getattr(config, "residual", None) else ""
    tying = "tied" if tied else "untied"
    log.info("loaded %s (%s, %s%s) on %s in %s", root, arch, tying, residual, device, dtype)
    if qcfg is not None and qcfg.fp8_kv_cache:  # a hint only: QuantConfig.fp8_kv_cache says why
        log.info("%s declares an FP8 KV cache: pass kv_cache_dtype='fp8' to use one", root)


def _stream_weights(
    params: dict[str, torch.Tensor],
    found: dict[str, tuple[Path, tuple[int, ...]]],
    source: dict[str, str],
    slices: dict[str, tuple[str, int]],
    root: Path,
    finite: FiniteCheck | None,
    qreader: Any,  # `quantized_reader`'s: Fp8Reader or Nvfp4Reader
    reader: Any = None,  # sliced loading: reader.read(file, stored name, name) -> this rank's part
    deferred: set[str] = frozenset(),  # NVFP4 parameters left unallocated (deferred.py)
) -> None:
    """Copy every checkpoint tensor into its (allocated) parameter, one file open at a time
    (a quantized weight dequantized: the reader's `take` keeps the quantized tensor and its
    scales; a deferred one is only kept, its finite check on its scales)."""
    by_file: dict[Path, list[str]] = {}
    for name, (f, _) in found.items():
        by_file.setdefault(f, []).append(name)
    with tqdm(total=len(found), desc=f"loading {root.name}", unit="tensor", disable=None) as bar:
        for f, names in by_file.items():
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for name in names:
                    target = params[name] if name not in slices else params[slices[name][0]]
                    if name in slices:
                        target = target[slices[name][1]]
                    stored = source[name]
                    tensor = reader.read(st, stored, name) if reader else st.get_tensor(stored)
                    if (slices[name][0] if name in slices else name) in deferred:
                        _keep(qreader, name, f, tensor, stored, target.dtype, finite)
                        bar.update()
                        continue
                    tensor = qreader.take(name, f, tensor)
                    if target.is_floating_point() and not tensor.is_floating_point():
                        raise CheckpointError(
                            f"{f}: tensor '{source[name]}' has dtype "
                            f"{str(tensor.dtype).removeprefix('torch.')}, expected a float weight"
                        )
                    with torch.no_grad():
                        target.copy_(tensor)
                    if finite is not None:
                        finite.add(f, source[name], target)
                    bar.update()


def _keep(
    qreader: Any,
    name: str,
    f: Path,
    tensor: torch.Tensor,
    stored: str,
    dtype: torch.dtype,
    finite: FiniteCheck | None,
) -> None:
    """A deferred NVFP4 weight: kept packed by the reader, its finite check on each row's
    largest representable value (6 x its block scales: NaN, Inf, an overflow of `dtype`)."""
    kept = qreader.keep(name, f, tensor)
    if finite is not None:
        largest = kept.scales().amax(dim=-1) * E2M1_MAX
        finite.add(f, stored, largest.to(dtype))


def resolve_model_path(model: str) -> Path:
    """A local directory, or an HF hub id already in the local cache (nothing is downloaded)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if model.count("/") == 1 and not path.exists():
        hub = envs.hf_hub_cache()
        repo = hub / ("models--" + model.replace("/", "--"))
        ref = repo / "refs" / "main"
        if ref.is_file():
            snap = repo / "snapshots" / ref.read_text().strip()
            if snap.is_dir():
                return snap
        raise CheckpointError(
            f"{model}: not a local directory, and not in the Hugging Face cache at {hub} "
            "(dlmrt never downloads weights; fetch them first, e.g. `hf download`)"
        )
    return _directory(path)


def _architecture(raw: dict[str, Any], cfg_path: Path) -> tuple[str, tuple[type, Any]]:
    """config.json's first architecture and its family's (model class, config parser)."""
    archs = raw.get("architectures") or []
    arch = archs if isinstance(archs, str) else (archs[0] if archs else None)
    if arch is None:
        raise CheckpointError(f"{cfg_path}: missing required config field 'architectures'")
    try:
        return arch, models.resolve(arch)
    except KeyError:
        raise CheckpointError(
            f"{cfg_path}: unsupported architecture '{arch}' "
            f"(supported: {', '.join(models.supported_architectures())})"
        ) from None


def _directory(path: Path) -> Path:
    """`path` if it is a directory; else a CheckpointError saying what it is."""
    if not path.is_dir():
        what = "not a checkpoint directory" if path.exists() else "path does not exist"
        raise CheckpointError(f"{path}: {what}")
    return path
