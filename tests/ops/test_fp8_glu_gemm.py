"""kernels/fp8_glu_gemm.py (gate|up + activation in one FP8 GEMM) and kernels/fp8_gemm.py's `amax`
input form vs their twins; the gated MLPs' fused form vs their separate form.

On CUDA (`pytest -m gpu` picks these up too): rows 1 / 7 / 32 / 256 / 512, awkward sizes, bf16,
a CUDA-graph replay. Without CUDA, TRITON_INTERPRET=1 runs small cases on the CPU in fp32 (the
interpreter's fp8 dot is exact: compared tightly, and the `amax` form bit for bit).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import capture_guard
from dlmrt.formats.fp8 import quantize_per_channel, quantize_rows

ROWS = (1, 7, 32, 256, 512) if CUDA else (1, 7, 33)
SHAPES = [(136, 272), (1536, 2560)] if CUDA else [(136, 272), (64, 128)]  # (I, K); 136: a
# partial last tile whose gate half reads into the up rows
DTYPE = torch.bfloat16 if CUDA else torch.float32


def _case(rows: int, i: int, k: int):
    g = torch.Generator().manual_seed(rows * 5 + i + k)
    x = torch.randn(rows, k, generator=g)
    x[:, : k // 4] *= 6
    w = quantize_per_channel(torch.randn(2 * i, k, generator=g) / k**0.5)
    return quantize_rows(x), w


def _twin(act, w, gelu: bool) -> torch.Tensor:
    gate_up = (act.dequantize(torch.float32) @ w.dequantize(torch.float32).t()).to(DTYPE)
    gate, up = gate_up.float().chunk(2, dim=-1)
    a = F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)
    return (a.to(DTYPE).float() * up).to(DTYPE)


def _glu(act, w, config, gelu):
    from dlmrt._kernels.fp8_glu_gemm import fp8_glu_gemm

    return fp8_glu_gemm(
        act.q.to(DEV), act.scale.to(DEV), w.qweight.to(DEV), w.scale.to(DEV), DTYPE, config, gelu
    )


@kernel_test
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("i", "k"), SHAPES)
@pytest.mark.parametrize("gelu", (False, True))
def test_glu_kernel_matches_its_twin(rows, i, k, gelu):
    act, w = _case(rows, i, k)
    config = (64 if rows <= 64 or not CUDA else 128, 64, 128 if CUDA else 64, 3, 4)
    y, amax = _glu(act, w, config, gelu)
    want = _twin(act, w, gelu)
    assert y.shape == (rows, i) and y.dtype == DTYPE and amax.shape == (rows,)
    # CUDA: bf16 gate / up roundings flip with summation order, and Hopper's FP8 MMA accumulates
    # with ~14 mantissa bits, an error that scales with the sum of |a w| rather than the result:
    # bounded by the output's scale, as in test_fp8_gemm.py (a wrong tile or half is off by ~all)
    tol = 1e-2 if CUDA else 1e-5
    atol = tol * want.abs().max().item() if CUDA else tol
    torch.testing.assert_close(y.float().cpu(), want.float(), rtol=tol, atol=atol)
    assert torch.equal(amax.cpu(), y.float().abs().amax(1).cpu()), "amax is exact: a max"


@kernel_test
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("tma", (0, 1))
@pytest.mark.parametrize("split", (1, 3))
def test_amax_input_gives_the_codes_of_the_row_quantizer(rows, tma, split):
    from dlmrt._kernels.fp8_gemm import fp8_gemm, tiles
    from dlmrt._kernels.fp8_quant import quant_rows  # the unfused path's quantizer (the
    # interpreter's e4m3 cast is not torch's near a binade's top: compare cast with cast)

    n, k = (1040, 1536) if CUDA else (130, 272)
    g = torch.Generator().manual_seed(rows + tma)
    y = (torch.randn(rows, k, generator=g) * torch.rand(rows, 1, generator=g) * 4).to(DTYPE)
    y[0, :] = 0  # an all-zero row: the minimum scale, codes 0
    w = quantize_per_channel(torch.randn(n, k, generator=g) / k**0.5)
    config = (64, 64, 128 if CUDA else 64, split, 3, 4, tma)
    counts = torch.zeros(tiles(rows, n, 64, 64), dtype=torch.int32, device=DEV)
    wq, ws, yd = w.qweight.to(DEV), w.scale.to(DEV), y.to(DEV)
    q, scale = quant_rows(yd)
    amax = yd.float().abs().amax(1)
    got = fp8_gemm(yd, amax, wq, ws, counts, DTYPE, config, amax=True)
    want = fp8_gemm(q, scale, wq, ws, counts, DTYPE, config)
    assert torch.equal(got, want), "quantizing while loading must give quantize_rows' codes"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("gelu", (False, True))
def test_mlp_fused_form_matches_the_separate_form_and_replays(monkeypatch, gelu):
    from dlmrt.impls.dense_install import set_gate_up
    from dlmrt.impls.fp8_linear import Fp8Linear
    from dlmrt.impls.gate_up import FusedGlu, QuantGateUp
    from dlmrt.impls.glu_install import install_glu
    from dlmrt.models.layers import GeGLU, SwiGLU
    from dlmrt.ops import fp8 as fp8_ops
    from dlmrt.ops import gemma

    monkeypatch.setenv("DLMRT_FP8_GLU", "on")
    hidden, inter, rows = 1024, 2816, 256
    mlp = (GeGLU if gelu else SwiGLU)(hidden, inter).to("cuda", torch.bfloat16)
    w = quantize_per_channel(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).float())
    act = gemma.gelu_mul if gelu else fp8_ops.silu_mul_fp8  # as dense_install.fp8_gated_mlp
    set_gate_up(mlp, QuantGateUp(Fp8Linear(w, torch.bfloat16), act))
    mlp.down_proj = Fp8Linear(quantize_per_channel(mlp.down_proj.weight.float()), torch.bfloat16)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    arg = x if gelu else fp8_ops.quant_rows(x)  # SwiGLU's input comes quantized from its norm
    separate = mlp(arg)
    assert install_glu("mlp", mlp, rows) and isinstance(mlp.gate_up, FusedGlu)
    fused = mlp(arg)
    torch.testing.assert_close(fused.float(), separate.float(), rtol=5e-2, atol=5e-2)
    graph = torch.cuda.CUDAGraph()
    mlp(arg)  # warm (compiles outside the capture)
    with capture_guard.graph(graph):
        out = mlp(arg)
    for _ in range(2):  # the amax buffer is zeroed inside the graph: replays agree
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fused)
    assert mlp(x[:7] if gelu else fp8_ops.quant_rows(x[:7])).shape == (7, hidden)  # other rows


def test_the_choice_is_off_on_the_cpu_and_the_env_is_checked(monkeypatch):
    from dlmrt.ops.fp8_glu_choice import glu_configs, use_glu

    assert use_glu(256, 9728, 2560, 2560, torch.device("cpu"), False)[0] is False
    assert {c[0] for c in glu_configs(32)} == {64} and 128 in {c[0] for c in glu_configs(256)}
    monkeypatch.setenv("DLMRT_FP8_GLU", "sometimes")
    with pytest.raises(ValueError, match="DLMRT_FP8_GLU"):
        use_glu(256, 9728, 2560, 2560, torch.device("cuda"), False)
