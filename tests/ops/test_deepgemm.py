"""DeepGEMM as an optional bf16 linear (`dlmrt/ops/deepgemm.py`).

On the CPU: the library absent gives F.linear and one log line; the DLMRT_DEEPGEMM pin; the
torch path is F.linear; and, through a stand-in `deep_gemm` whose `bf16_gemm_nt` checks the
contract of csrc/apis/gemm.hpp strictly (A [M, K], B [N, K] K-major bf16, D [M, N] preallocated
N-major, D = A @ B^T), the detection rules, the per-shape choice and the call's layouts. On the
GPU (`pytest -m gpu`, where deep_gemm is built: benchmarks/deepgemm/README.md) the real library
against F.linear at 1 / 7 / 32 / 256 rows.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from dlmrt import capture_guard
from dlmrt.ops import choices, deepgemm


def fake_bf16_gemm_nt(a, b, d, c=None, compiled_dims="nk"):
    """`bf16_gemm_nt`'s contract, in torch: D = A @ B^T into the given D (no accumulation)."""
    assert c is None and compiled_dims == "nk"
    assert a.dim() == b.dim() == d.dim() == 2 and a.shape[1] == b.shape[1]
    assert d.shape == (a.shape[0], b.shape[0]) and d.is_contiguous()
    assert a.dtype == b.dtype == d.dtype == torch.bfloat16
    assert a.stride(-1) == 1 and b.stride(-1) == 1  # K-major operands
    d.copy_(a.float() @ b.float().t())


def fake_library() -> types.ModuleType:
    mod = types.ModuleType(deepgemm.MODULE)
    mod.__version__ = "9.9.9"
    mod.bf16_gemm_nt = fake_bf16_gemm_nt
    return mod


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("DLMRT_DEEPGEMM", "auto")  # the tests' setting; the default is "off"
    deepgemm.reset()
    yield
    deepgemm.reset()


@pytest.fixture
def sm90(monkeypatch):
    """A stand-in library on a (faked) SM90 device."""
    monkeypatch.setitem(sys.modules, deepgemm.MODULE, fake_library())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(deepgemm.LIBRARY)]


def test_absent_library_falls_back_with_one_log_line(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, deepgemm.MODULE, None)  # import fails: not installed
    x, w = torch.randn(7, 64, dtype=torch.bfloat16), torch.randn(48, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        assert deepgemm.library() is None and deepgemm.library() is None
        for _ in range(3):
            assert torch.equal(deepgemm.linear_bf16(x, w), F.linear(x, w))
    lines = _lines(caplog)
    assert len(lines) == 1, lines
    assert "not usable" in lines[0] and "ModuleNotFoundError" in lines[0]
    assert "benchmarks/deepgemm/README.md" in lines[0]  # says how to get it
    assert choices.get(deepgemm.LIBRARY).pick == "not usable"


def test_the_default_is_off(monkeypatch, sm90):
    """Off until a GPU run shows it working and faster (docs/kernels.md: it crashed on the H100)."""
    monkeypatch.delenv("DLMRT_DEEPGEMM")
    assert deepgemm.library() is None
    assert choices.get(deepgemm.LIBRARY).line() == f"{deepgemm.LIBRARY}: off (DLMRT_DEEPGEMM=off)"


def test_pin_is_parsed(monkeypatch, sm90):
    monkeypatch.setenv("DLMRT_DEEPGEMM", "off")
    assert deepgemm.library() is None  # installed and on SM90, but pinned off
    assert choices.get(deepgemm.LIBRARY).line() == f"{deepgemm.LIBRARY}: off (DLMRT_DEEPGEMM=off)"
    for value in ("auto", "ON"):  # case-insensitive, as every pin
        deepgemm.reset()
        monkeypatch.setenv("DLMRT_DEEPGEMM", value)
        assert deepgemm.library() is sys.modules[deepgemm.MODULE]
        assert choices.get(deepgemm.LIBRARY).pick == "installed"
    deepgemm.reset()
    monkeypatch.setenv("DLMRT_DEEPGEMM", "yes")
    with pytest.raises(ValueError, match="DLMRT_DEEPGEMM='yes'"):
        deepgemm.library()


@pytest.mark.parametrize(
    "capability,cuda,reason",
    [((8, 0), True, "compute capability 8.0"), ((12, 0), True, "12.0"), ((9, 0), False, "no CUDA")],
)
def test_device_rules(monkeypatch, capability, cuda, reason):
    """Only SM90 and SM100 run DeepGEMM's GEMMs (Ampere and consumer Blackwell do not)."""
    monkeypatch.setitem(sys.modules, deepgemm.MODULE, fake_library())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert deepgemm.library() is None
    assert choices.get(deepgemm.LIBRARY).pick == "not usable"
    assert reason in choices.get(deepgemm.LIBRARY).why


def test_a_library_without_its_bf16_gemm_is_not_usable(monkeypatch):
    old = types.ModuleType(deepgemm.MODULE)  # its bf16 kernels are missing below CUDA 12.3
    monkeypatch.setitem(sys.modules, deepgemm.MODULE, old)
    assert deepgemm.library() is None
    assert "no bf16_gemm_nt" in choices.get(deepgemm.LIBRARY).why


@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 64), (64,)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_torch_path_is_f_linear(shape, dtype):
    """Without the library (this CPU), any x and w: exactly F.linear."""
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=g).to(dtype)
    w = torch.randn(40, 64, generator=g).to(dtype)
    assert torch.equal(deepgemm.linear_bf16(x, w), F.linear(x, w))


def test_cpu_tensors_never_fit():
    x, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    assert not deepgemm.fits(x, w)


@pytest.mark.parametrize("shape", [(7, 64), (2, 3, 64), (64,)])
def test_the_call_keeps_f_linears_contract(monkeypatch, sm90, shape):
    """Through the stand-in: leading dims flattened into A's rows and restored, D = A @ B^T."""
    monkeypatch.setenv("DLMRT_DEEPGEMM", "on")
    monkeypatch.setattr(deepgemm, "fits", lambda x, w: True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=g).bfloat16()
    w = torch.randn(40, 64, generator=g).bfloat16()
    got = deepgemm.linear_bf16(x, w)
    assert deepgemm.chosen(x, w)
    assert got.shape == F.linear(x, w).shape and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-2, atol=1e-2)


def test_auto_measures_once_per_shape_and_logs(monkeypatch, sm90, caplog):
    monkeypatch.setattr(deepgemm, "fits", lambda x, w: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    timings = {7: (10.0, 8.0), 32: (10.0, 12.0)}  # rows -> (cuBLAS, DeepGEMM) µs
    calls = []

    def measure(rows, n, k, device, mod):
        calls.append(rows)
        return timings[rows]

    monkeypatch.setattr(deepgemm, "_measure", measure)
    w = torch.randn(48, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        for _ in range(3):
            assert deepgemm.chosen(torch.randn(7, 64, dtype=torch.bfloat16), w)
            assert not deepgemm.chosen(torch.randn(32, 64, dtype=torch.bfloat16), w)
    assert calls == [7, 32]  # once per shape
    picks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("bf16 linear")]
    assert picks == [
        "bf16 linear 7x64->48: DeepGEMM (cuBLAS 10.0 us, DeepGEMM 8.0 us)",
        "bf16 linear 32x64->48: cuBLAS (cuBLAS 10.0 us, DeepGEMM 12.0 us)",
    ]


def test_no_measurement_inside_a_capture(monkeypatch, sm90):
    """Under a capture an undecided shape takes torch (the warm-up before it decides)."""
    monkeypatch.setattr(deepgemm, "fits", lambda x, w: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(deepgemm, "_measure", lambda *a: pytest.fail("timed inside a capture"))
    x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(48, 64, dtype=torch.bfloat16)
    assert not deepgemm.chosen(x, w)
    assert choices.get("bf16 linear 4x64->48") is None  # still undecided


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 7, 32, 256])
@pytest.mark.parametrize("n,k", [(2560, 4096), (1408, 2816), (6144, 2048)])
def test_deepgemm_matches_torch_on_the_gpu(monkeypatch, rows, n, k):
    """The real library, pinned on: DeepGEMM ran (chosen), its result within bf16 rounding of
    F.linear's and of the fp32 product, and a CUDA-graph replay gives the eager result."""
    pytest.importorskip(deepgemm.MODULE)
    monkeypatch.setenv("DLMRT_DEEPGEMM", "on")
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).bfloat16()
    assert deepgemm.library() is not None, choices.get(deepgemm.LIBRARY).line()
    assert deepgemm.chosen(x, w)
    got = deepgemm.linear_bf16(x, w)
    want = x.float() @ w.float().t()
    assert float((got.float() - want).norm() / want.norm()) < 1e-2
    torch.testing.assert_close(got, F.linear(x, w), rtol=2e-2, atol=2e-2)
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        static = deepgemm.linear_bf16(x, w)
    graph.replay()
    assert torch.equal(static, got)
