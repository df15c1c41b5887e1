"""The NVFP4 expert kernel (kernels/moe_mlp_nvfp4.py) vs its twin (dequantize, then the plain op).

The twin test runs on the CPU. Device machine: `pytest -m gpu tests/quant/test_nvfp4_kernel.py` (real e4m3 block scales, bf16 and
fp32, awkward sizes, CUDA-graph capture). Without CUDA, TRITON_INTERPRET=1 runs the fp32 cases on
the CPU with the block scales passed as fp32 (the interpreter's e4m3 casts round wrongly; its bf16
tl.dot is broken).
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import capture_guard
from dlmrt.formats.nvfp4 import Nvfp4Weight, quantize_nvfp4
from dlmrt.ops import reference
from dlmrt.ops.nvfp4 import moe_mlp_nvfp4, split_gate_up

needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def _kernel():
    from dlmrt._kernels.moe_mlp_nvfp4 import moe_mlp_nvfp4 as kernel

    return kernel


def _weight(shape, gen, fp32_scales: bool) -> Nvfp4Weight:
    w = quantize_nvfp4(
        torch.randn(*shape, generator=gen) * torch.rand(shape[0], 1, 1, generator=gen)
    )
    bs = w.block_scale.float() if fp32_scales else w.block_scale
    return Nvfp4Weight(w.packed.to(DEV), bs.to(DEV), w.global_scale.to(DEV))


def _case(rows, experts, hidden, inter, top_k, dtype, seed=0, fp32_scales=not CUDA):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen).to(DEV, dtype)
    index = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(rows)])
    weights = torch.rand(rows, top_k, generator=gen).to(DEV, dtype)
    gate_up = _weight((experts, 2 * inter, hidden), gen, fp32_scales)
    down = _weight((experts, hidden, inter), gen, fp32_scales)
    return x, weights, index.to(DEV), gate_up, down


def _twin(x, weights, index, gate_up, down, activation):
    gate, up = split_gate_up(gate_up)
    g, u, d = (w.dequantize(x.dtype) for w in (gate, up, down))
    return reference.moe_mlp(x, weights, index, (g, u), d, activation, torch.float32)


def _run(x, weights, index, gate_up, down, activation, **kw):
    gate, up = split_gate_up(gate_up)
    args = [
        (w.packed, w.block_scale, w.global_scale.reshape(-1).expand(w.packed.shape[0]).contiguous())
        for w in (gate, up, down)
    ]
    return _kernel()(x, weights, index, *args, activation, **kw)


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize(
    "rows, experts, hidden, inter, top_k", [(5, 6, 96, 48, 2), (3, 4, 48, 80, 3)]
)
@pytest.mark.parametrize("swap", [True, False])
def test_kernel_matches_the_twin_fp32(rows, experts, hidden, inter, top_k, activation, swap):
    case = _case(rows, experts, hidden, inter, top_k, torch.float32)
    got = _run(*case, activation, bk=32, swap=swap)
    want = _twin(*case, activation)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.gpu
@kernel_test
def test_kernel_defaults_take_wide_tiles_when_experts_get_many_rows():
    """80 pairs over 4 experts: the default tiles are (BM 32, BK 128); K = 96 and 48 mask."""
    from dlmrt._kernels.moe_mlp_nvfp4 import _tiles

    assert _tiles(80, 4, None, None) == (32, 128) and _tiles(80, 16, None, None) == (16, 128)
    case = _case(40, 4, 96, 48, 2, torch.float32, seed=5)
    got, want = _run(*case, "gelu_tanh"), _twin(*case, "gelu_tanh")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 7, 32, 100])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_kernel_matches_the_twin_bf16_with_e4m3_scales(rows, activation):
    """Real e4m3 block scales, bf16, hidden / inter not multiples of the tiles."""
    case = _case(rows, 24, 272, 144, 4, torch.bfloat16, seed=rows, fp32_scales=False)
    assert case[3].block_scale.dtype == torch.float8_e4m3fn
    got = _run(*case, activation)
    want = _twin(*case, activation)
    # the dequantized weights are the same bits; only the sums' order differs
    torch.testing.assert_close(
        got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item()
    )


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 7, 32, 256, 512])
def test_inline_ptx_decode_equals_the_plain_triton_decode_bit_for_bit(rows):
    """kernels/e2m1_decode.py: the packed PTX placement + bf16x2 scale multiply and the plain
    Triton operations make the same exact weights (code * block scale * 2^-7), so the layer's
    outputs are the same bits; every code (0.5, the subnormal placement, included) occurs."""
    case = _case(rows, 16, 272, 144, 4, torch.bfloat16, seed=rows, fp32_scales=False)
    case[3].packed[:, :, :2] = 0x98  # -0 (code 8), which rounding never makes, and -0.5
    codes = torch.cat([case[3].packed.flatten() & 15, case[3].packed.flatten() >> 4])
    assert codes.unique().numel() == 16
    for activation in ("silu", "gelu_tanh"):
        fast = _run(*case, activation, asm=True)
        plain = _run(*case, activation, asm=False)
        assert torch.equal(fast, plain)


@pytest.mark.gpu
@needs_cuda
def test_op_dispatches_to_the_kernel_and_graph_capture_replays():
    x, weights, index, gate_up, down = _case(32, 16, 128, 64, 4, torch.bfloat16, fp32_scales=False)
    gate, up = split_gate_up(gate_up)
    eager = moe_mlp_nvfp4(x, weights, index, gate, up, down, "silu")
    torch.testing.assert_close(
        eager, _run(x, weights, index, gate_up, down, "silu"), rtol=0, atol=0
    )
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        out = moe_mlp_nvfp4(x, weights, index, gate, up, down, "silu")
    graph.replay()
    assert torch.equal(out, eager)


def test_twin_is_dequantize_then_the_plain_op():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 32, generator=gen)
    index = torch.tensor([[0, 1], [1, 2], [2, 0], [1, 0]])
    weights = torch.rand(4, 2, generator=gen)
    gu = quantize_nvfp4(torch.randn(3, 32, 32, generator=gen))
    down = quantize_nvfp4(torch.randn(3, 32, 16, generator=gen))
    gate, up = split_gate_up(gu)
    got = moe_mlp_nvfp4(x, weights, index, gate, up, down, "silu")
    deq = gu.dequantize(torch.float32)
    want = reference.moe_mlp(
        x, weights, index, (deq[:, :16], deq[:, 16:]), down.dequantize(torch.float32), "silu"
    )
    assert torch.equal(got, want)


@pytest.mark.gpu
@kernel_test
def test_the_hidden_hook_runs_between_the_two_gemms_as_in_the_twin():
    """W4A4 emulation (`activations="nvfp4"`): the hidden act(gate) * up quantize-dequantized
    before the down projection, in the kernel as in the twin."""
    from dlmrt.ops.nvfp4 import fake_quant_act

    x, weights, index, gate_up, down = _case(5, 6, 96, 48, 2, torch.float32, seed=2)
    hook = lambda h: fake_quant_act(h, torch.tensor(0.002, device=h.device))  # noqa: E731
    got = _run(x, weights, index, gate_up, down, "silu", bk=32, hidden_hook=hook)
    gate, up = split_gate_up(gate_up)
    g, u, d = (w.dequantize(x.dtype) for w in (gate, up, down))
    want = reference.moe_mlp(x, weights, index, (g, u), d, "silu", torch.float32, hook)
    plain = _run(x, weights, index, gate_up, down, "silu", bk=32)
    # a hidden value within rounding of an E2M1 midpoint may land on either side: compare norms
    assert (got - want).norm() < 0.02 * want.norm() < (plain - want).norm()
