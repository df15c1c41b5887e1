"""DeepGEMM (`deep_gemm`, optional) as a bf16 linear: detected once, chosen per shape.

DeepGEMM (github.com/deepseek-ai/DeepGEMM) JIT-compiles its SM90 / SM100 kernels at first use
with the machine's nvcc; its PyPI package does not build, so it is built from its repository
(benchmarks/deepgemm/README.md: stage.sh, build.sh). `linear_bf16(x, w)` is F.linear(x, w) for
bf16 x [..., K] and w [N, K], run as DeepGEMM's `bf16_gemm_nt` (csrc/apis/gemm.hpp of the
repository: D = A @ B^T with A [M, K], B [N, K], D [M, N] preallocated, all K-major) when chosen,
else as F.linear.

The models reach it through `impls/deepgemm_install.py` (run by the loader last): each layer's
bf16 q|k|v, gate|up, o_proj and down_proj whose shape `chosen` gives to DeepGEMM at the block
rows; benchmarks/deepgemm/shapes.py measures every projection shape of the three families.

DeepGEMM runs only when all of these hold, else F.linear: DLMRT_DEEPGEMM is not "off";
`deep_gemm` imports and a CUDA device of compute capability 9.x or 10.x is present (detected
once, recorded in the choices registry under `LIBRARY`: one INFO line, naming the fallback's
reason); `fits(x, w)` (bf16 CUDA tensors, K-major, TMA-aligned); and, under DLMRT_DEEPGEMM=auto,
DeepGEMM timed faster than cuBLAS at that (rows, N, K), once, outside graph capture (`_measure`:
graph replay cycling over weight copies that exceed the L2, as `ops/fp8_choice.py` times).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
import torch.nn.functional as F

from dlmrt import envs
from dlmrt.ops import choices
from dlmrt.ops.fp8_choice import COPIES, L2_BYTES, cold_time_us

MODULE = "deep_gemm"
INSTALL = "build it from its repository: benchmarks/deepgemm/README.md"
LIBRARY = "deep_gemm for bf16 linears"  # the detection's key in the registry
ARCHS = (9, 10)  # compute capability majors DeepGEMM's GEMMs dispatch on (csrc/apis/gemm.hpp)
_LIB: list[ModuleType | None] = []  # [deep_gemm or None], resolved on first use
_CHOICE: dict[tuple, bool] = {}  # (rows, n, k, device) -> the registry's pick: per-call lookup


def library() -> ModuleType | None:
    """The `deep_gemm` module, or None (DLMRT_DEEPGEMM=off, not importable, no SM90 / SM100
    device); decided once and recorded (logged once)."""
    if not _LIB:
        mod, pick, why = None, "off", "DLMRT_DEEPGEMM=off"
        if envs.deepgemm() != "off":
            mod, pick, why = _detect()
        choices.record(LIBRARY, pick, why)
        _LIB.append(mod)
    return _LIB[0]


def _detect() -> tuple[ModuleType | None, str, str]:
    """(module or None, pick, why) of this process: the import first (its failure is the usual
    reason on a machine without the library), then the device."""
    try:
        mod = importlib.import_module(MODULE)
    except Exception as exc:  # noqa: BLE001 (any failed import means: not usable)
        return None, "not usable", f"{type(exc).__name__}: {exc}; {INSTALL}"
    if not hasattr(mod, "bf16_gemm_nt"):  # built against a CUDA too old for its TMA kernels
        return None, "not usable", f"deep_gemm {_version(mod)} has no bf16_gemm_nt; {INSTALL}"
    if not torch.cuda.is_available():
        return None, "not usable", "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major not in ARCHS:
        return None, "not usable", f"compute capability {major}.{minor}: needs SM90 or SM100"
    return mod, "installed", f"deep_gemm {_version(mod)}, SM{major}{minor}"


def _version(mod: ModuleType) -> str:
    return str(getattr(mod, "__version__", "?"))


def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `bf16_gemm_nt` takes x [..., K] @ w [N, K]^T: bf16 CUDA tensors, w 2-D, unit
    last strides (K-major, the layout the SM90 kernels load), x's rows one stride apart, and TMA's
    16-byte rule for every base address and row stride (K and N multiples of 8 in bf16)."""
    if not (x.is_cuda and x.dtype == w.dtype == torch.bfloat16 and w.dim() == 2 and x.dim() >= 1):
        return False
    n, k = w.shape
    if x.shape[-1] != k or x.numel() == 0 or k % 8 or n % 8:
        return False
    if x.stride(-1) != 1 or w.stride(-1) != 1 or w.stride(0) % 8:
        return False
    rows = x.reshape(-1, k) if x.is_contiguous() else x
    if rows.dim() != 2 or rows.stride(0) % 8:  # a non-contiguous x of more than 2 dims
        return False
    return x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0


def gemm(x: torch.Tensor, w: torch.Tensor, mod: ModuleType | None = None) -> torch.Tensor:
    """x [..., K] @ w [N, K]^T through DeepGEMM's `bf16_gemm_nt` (callers check `fits`); `mod`
    default: the detected library."""
    mod = mod or library()
    k, n = x.shape[-1], w.shape[0]
    a = x.reshape(-1, k)
    out = torch.empty(a.shape[0], n, device=x.device, dtype=torch.bfloat16)
    mod.bf16_gemm_nt(a, w, out)  # (a, b, d, c=None, compiled_dims="nk"): d = a @ b^T
    return out.view(*x.shape[:-1], n)


def chosen(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether x @ w^T runs on DeepGEMM (decided once per (rows, N, K, device))."""
    if (mod := library()) is None or not fits(x, w):  # cached: cheap when absent
        return False
    rows, (n, k) = x.numel() // x.shape[-1], w.shape
    key = (rows, n, k, x.device)
    if key not in _CHOICE:  # decided once per key, so the per-call cost is one lookup
        what = f"bf16 linear {rows}x{k}->{n}"
        if envs.deepgemm() == "on":
            _CHOICE[key] = choices.record(what, "DeepGEMM", "DLMRT_DEEPGEMM=on").pick == "DeepGEMM"
        elif torch.cuda.is_current_stream_capturing():
            return False  # no timing inside a capture (the warm-up before it decides)
        else:
            cublas, deepgemm = _measure(rows, n, k, x.device, mod)
            pick = "DeepGEMM" if deepgemm < cublas else "cuBLAS"
            why = f"cuBLAS {cublas:.1f} us, DeepGEMM {deepgemm:.1f} us"
            options = {"cuBLAS": cublas, "DeepGEMM": deepgemm}
            _CHOICE[key] = choices.record(what, pick, why, options).pick == "DeepGEMM"
    return _CHOICE[key]


def linear_bf16(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w) (no bias) on DeepGEMM where `chosen`, else on torch; same shape and dtype
    either way (the values differ only in the GEMMs' summation order)."""
    if chosen(x, w):
        return gemm(x, w)
    return F.linear(x, w)


def _measure(
    rows: int, n: int, k: int, device: torch.device, mod: ModuleType
) -> tuple[float, float]:
    """(cuBLAS µs, DeepGEMM µs) of [rows, k] @ [n, k]^T, graph-replayed over weight copies that
    exceed the L2 (a layer's weight comes from HBM in a round). DeepGEMM compiles its kernel for
    this shape in the warm-up calls, outside the timed graph."""
    copies = min(COPIES, -(-L2_BYTES // (2 * n * k)))
    x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
    ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(copies)]
    cublas = cold_time_us(lambda w: F.linear(x, w), ws)
    return cublas, cold_time_us(lambda w: gemm(x, w, mod), ws)


def reset() -> None:
    """Forget the detection and the measured choices (tests)."""
    _LIB.clear()
    _CHOICE.clear()
    choices.forget(LIBRARY)
    choices.forget("bf16 linear ")
