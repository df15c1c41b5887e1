"""After the weights streamed in: which weights are quantized (FP8 or NVFP4), where they run, and
the startup log.

`collect_quantized` gathers the checkpoint's quantized weights (the reader) and, with `quantization="fp8"`,
quantizes every other FP8 candidate (`policy.py`) per channel, except those in the checkpoint's ignore
list and those sharing storage with a weight that stays in the compute dtype (a tied lm_head).
Every parameter then holds the dequantized weight, the CPU path. `place_quantized` hands the quantized
weights to the model's `use_quantized` on CUDA (its FP8 / NVFP4 kernels) and re-dequantizes what it declines (`install`,
also used on a built model with `quantize_candidates`: the tests, the benchmarks).
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from dlmrt.config import PREFERENCES, QUANTIZATIONS
from dlmrt.formats.fp8 import Fp8Weight, quantize_per_channel
from dlmrt.formats.nvfp4 import Nvfp4Weight
from dlmrt.loading.deferred import materialize
from dlmrt.loading.policy import classify, matches
from dlmrt.loading.reader import Fp8Reader
from dlmrt.ops import choices

log = logging.getLogger("dlmrt")


def collect_quantized(
    reader: Fp8Reader, params: dict[str, torch.Tensor], quantization: str | None
) -> tuple[dict[str, Fp8Weight | Nvfp4Weight], dict[str, str]]:
    """(quantized weights by parameter name, why each other FP8 candidate stays in the compute dtype).

    quantization None: the checkpoint's FP8 (or NVFP4) weights; "fp8": also quantize the rest to
    FP8 at load; "none": no quantized weights (a quantized checkpoint runs dequantized)."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization: expected one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )
    stored = reader.weights(params)
    if not stored and quantization is None:
        return {}, {}  # an unquantized checkpoint, run as stored: nothing to say
    if quantization == "none":
        return {}, {n: "quantization='none': dequantized at load" for n in stored}
    fp8 = {n: w for n, w in stored.items() if classify(n)[0]}
    why = {n: f"stored FP8, but a {classify(n)[1]}: dequantized" for n in stored if n not in fp8}
    shared = {p.data_ptr() for n, p in params.items() if not classify(n)[0]}
    names = _stored_names(reader)
    for name, param in params.items():
        if name in fp8 or not classify(name)[0]:
            continue
        pattern = next(
            (p for s in names.get(name, [name]) if (p := matches(reader.ignore, s))), None
        )
        if pattern is not None:
            why[name] = f"in the checkpoint's ignore list ('{pattern}')"
        elif param.data_ptr() in shared:
            why[name] = (
                "tied to the embeddings (on CUDA its GEMM may run an FP8 copy: dlmrt/impls/install.py)"
            )
        elif quantization != "fp8":
            why[name] = "stored unquantized"
        else:
            q = quantize_per_channel(param)
            with torch.no_grad():
                param.copy_(q.dequantize(param.dtype))
            fp8[name] = host_copy(q)
    return fp8, why


def host_copy(w: Fp8Weight) -> Fp8Weight:
    """`w` in host memory until `install` places it: quantizing a loaded model never holds an FP8
    copy of every weight on the device beside the bf16 one (`install` frees each bf16 weight as
    its FP8 codes arrive), so an FP8 load peaks no higher than a bf16 load."""
    return w.to("cpu")


def quantize_candidates(model: torch.nn.Module) -> dict[str, Fp8Weight]:
    """Per-channel FP8 of a built model's every FP8 candidate (`policy.py`; a tied head is the
    embedding's parameter, so it stays out): `quantization="fp8"` without a checkpoint."""
    return {
        name: host_copy(quantize_per_channel(p.detach()))
        for name, p in model.named_parameters()
        if p.dim() >= 2 and classify(name)[0]
    }


def install(
    model: torch.nn.Module, fp8: dict, emulate: bool = False, prefer: str = "speed"
) -> tuple[dict, list[str]]:
    """(quantized weights `model.use_quantized` runs, names it declined): each declined one
    dequantized into its parameter, in the parameter's dtype (a deferred parameter allocated on
    the model's device first: `deferred.py`). `emulate`: W4A4 emulation (every NVFP4 MLP
    installed); `prefer`: "speed" or "memory" (`dlmrt/impls/install.py`)."""
    running = dict(fp8)  # use_quantized moves what it installs to the device
    declined = model.use_quantized(running, emulate=emulate, prefer=prefer)
    params = model.state_dict()
    device = model.embed_table.device if hasattr(model, "embed_table") else None
    unallocated = {}
    for name in declined:
        w, param = running.pop(name), params[name]
        if param.is_meta:
            unallocated[name] = w.to(device).dequantize(param.dtype)
            continue
        with torch.no_grad():
            param.copy_(w.to(param.device).dequantize(param.dtype))
    materialize(model, unallocated)
    return running, declined


def _stored_names(reader: Fp8Reader) -> dict[str, list[str]]:
    """Parameter name -> the checkpoint names it was read from (per-expert tensors of a stack)."""
    out: dict[str, list[str]] = {}
    for name, stored in reader.source.items():
        param = reader.slices[name][0] if name in reader.slices else name
        out.setdefault(param, []).append(stored)
    return out


def place_quantized(
    model: torch.nn.Module,
    fp8: dict[str, Fp8Weight | Nvfp4Weight],
    why: dict[str, str],
    device: torch.device,
    activations: str = "none",
    prefer: str = "speed",
) -> dict[str, Fp8Weight]:
    """Run what the model can quantized (CUDA + `model.use_quantized`); the rest stays dequantized.

    Returns the quantized weights the model runs (empty on CPU). Logs what runs quantized and what
    does not, why.
    activations="nvfp4": the NVFP4 experts and dense MLPs are installed on any device (on the CPU
    their twins run them) and their GEMM inputs quantize-dequantized (`emulate_w4a4`).
    prefer="memory": NVFP4 experts and dense MLPs stay on the W4A16 kernels, unmeasured."""
    if activations == "nvfp4" and not any(isinstance(w, Nvfp4Weight) for w in fp8.values()):
        raise ValueError(
            "activations='nvfp4': the checkpoint has no NVFP4 weights to emulate "
            "W4A4 with (an NVFP4 checkpoint, loaded without quantization='none')"
        )
    if not fp8 and not why:
        return {}
    dtype = next(model.parameters()).dtype
    running: dict[str, Fp8Weight] = {}
    what = f"quantized weights of {type(model).__name__} on {device.type}"
    if not _kernels_run(device, activations):
        reason = f"{device.type}: dequantized to {str(dtype).removeprefix('torch.')} at load"
        why |= {n: reason for n in fp8}
        choices.record(what, "dequantized", f"no quantized kernels on {device.type}")
    elif not hasattr(model, "use_quantized"):
        why |= {n: f"{type(model).__name__} has no quantized kernels (use_quantized)" for n in fp8}
        choices.record(what, "dequantized", "the model has no quantized kernels")
    else:
        choices.record(
            what,
            "the model's kernels",
            "W4A4 emulation" if activations == "nvfp4" else "each projection as its choices say",
        )
        running, declined = install(model, fp8, activations == "nvfp4", prefer)
        for name in declined:
            why[name] = (
                "kept by the model (dlmrt/impls/install.py: slower in FP8 at its shape, "
                "dims not multiples of 16, DLMRT_FP8_GEMMS=none, a shared expert, NVFP4 outside "
                "an all-NVFP4 gated MLP, or a dense MLP faster dequantized than on the NVFP4 kernel)"
            )
        if activations == "nvfp4":
            from dlmrt.impls.nvfp4_emulation import emulate_w4a4

            emulate_w4a4(model)
    _log(running, why)
    return running


def check_prefer(prefer: str) -> None:
    if prefer not in PREFERENCES:
        raise ValueError(f"prefer: expected one of {', '.join(PREFERENCES)}, got {prefer!r}")


def installs_quantized(
    model: torch.nn.Module, device: torch.device, quantization: str | None, activations: str
) -> bool:
    """Whether `place_quantized` will hand a quantized checkpoint's weights to the model's
    kernels (decided before the weights are read: `deferred.py`)."""
    usable = quantization != "none" and hasattr(model, "use_quantized")
    return usable and _kernels_run(device, activations)


def _kernels_run(device: torch.device, activations: str) -> bool:
    return has_quantized_kernels(device) or activations == "nvfp4"


def has_quantized_kernels(device: torch.device) -> bool:
    """Whether the models' quantized (FP8 / NVFP4) kernels can run on `device` (CUDA; the CPU
    path dequantizes)."""
    return device.type == "cuda"


def _log(running: dict[str, Fp8Weight], why: dict[str, str]) -> None:
    kinds = Counter(classify(n)[1] for n in running)
    mib = sum(w.nbytes for w in running.values()) / 2**20
    if running:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        log.info("quantized weights: %d tensor(s), %.1f MiB (%s)", len(running), mib, parts)
    else:
        log.info("quantized weights: none run quantized")
    reasons = Counter(why.values())
    for reason, count in sorted(reasons.items()):
        example = next(n for n, r in why.items() if r == reason)
        log.info("compute dtype: %d FP8 candidate(s): %s (e.g. %s)", count, reason, example)
    log.info(
        "compute dtype always: embeddings, norms, routers, the ORL residual adapter and "
        "the self-conditioning MLP (dlmrt/loading/policy.py)"
    )
