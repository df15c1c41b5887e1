"""FP8 W8A8 experts (kernels/moe_mlp_fp8.py) vs their twin (`dlmrt.ops.moe_fp8`: activations
fake-quantized with the kernel's groups, weights dequantized, then the plain op).

The twin tests run on the CPU; the kernel runs on CUDA (`pytest -m gpu`: bf16, rows 1 / 7 / 32 /
256 / 512, CUDA-graph capture) or on the CPU under TRITON_INTERPRET=1 (fp32 x: the interpreter's
bf16 casts are not the GPU's; its fp8 dot is exact).
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import capture_guard
from dlmrt.formats.fp8 import FP8, FP8_MAX, quantize_per_channel
from dlmrt.ops import reference
from dlmrt.ops.moe_fp8 import HIDDEN_GROUP, X_GROUP, fake_quant_groups, moe_mlp_w8a8

# bf16 on the GPU: the kernel rounds gate, up, act and the hidden to bf16 (as torch would) before
# quantizing the hidden, the fp32 twin does not, so some hidden codes round the other way (one
# e4m3 step, 1/16, each; seen up to 2.6% at one row); fp32 in the interpreter: the same codes,
# the same sums up to order (seen: 2e-6)
TOL = 0.04 if CUDA else 1e-4


def _case(rows, experts, hidden, inter, top_k, dtype, seed=0, index=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g)
    x[:, : hidden // 3] *= 8  # groups of different ranges: per-group scales matter
    if index is None:
        index = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(rows)])
    weights = torch.rand(rows, top_k, generator=g)
    gate, up = (
        quantize_per_channel(torch.randn(experts, inter, hidden, generator=g) / hidden**0.5)
        for _ in "gu"
    )
    down = quantize_per_channel(torch.randn(experts, hidden, inter, generator=g) / inter**0.5)
    to = lambda t: t.to(DEV)  # noqa: E731
    codes = (to(gate.qweight), to(up.qweight)), to(down.qweight)
    scales = tuple(to(w.scale) for w in (gate, up, down))
    return x.to(DEV, dtype), to(weights).to(dtype), to(index), *codes, scales


def _twin(x, weights, index, gate_up, down, activation, scales):
    """The twin on the CPU in fp32 (the reference for the kernel wherever it runs)."""
    cpu = [t.cpu() for t in (x, weights, index, *gate_up, down)]
    return moe_mlp_w8a8(
        cpu[0].float(),
        cpu[1].float(),
        cpu[2],
        (cpu[3], cpu[4]),
        cpu[5],
        activation,
        tuple(s.cpu() for s in scales),
    )


def _kernel(*args, **kw):
    from dlmrt._kernels.moe_mlp_fp8 import moe_mlp_fp8

    return moe_mlp_fp8(*args, **kw)


def _close(got, want, tol):
    """Relative error in the Frobenius norm: a rare e4m3 code rounded the other way (the kernel
    rounds the hidden from fp32 sums, the twin from its own) moves one element by one code step."""
    err = (got.float().cpu() - want.float()).norm() / want.float().norm().clamp_min(1e-6)
    assert err < tol, f"relative error {err:.4f} >= {tol}"


def test_fake_quant_groups_is_on_the_e4m3_grid_per_group():
    x = torch.randn(3, 200) * torch.linspace(0.01, 100, 200)  # 200: a partial last group
    y = fake_quant_groups(x, 64)
    for g0 in range(0, 200, 64):
        xs, ys = x[:, g0 : g0 + 64], y[:, g0 : g0 + 64]
        scale = xs.abs().amax(dim=1, keepdim=True) / FP8_MAX
        codes = ys / scale
        assert torch.equal(codes.to(FP8).float(), codes.float().round(decimals=6).to(FP8).float())
        assert torch.allclose(codes.abs().amax(dim=1), torch.full((3,), FP8_MAX), rtol=1e-5)
        assert ((ys - xs).abs() <= xs.abs() / 16 + scale * 2**-9).all()  # half an e4m3 step


def test_twin_is_the_bf16_op_within_fp8_activation_error():
    x, w, idx, gu, d, scales = _case(9, 6, 96, 80, 2, torch.float32, seed=1)
    deq = [(c.float() * s.unsqueeze(-1)) for c, s in zip((*gu, d), scales)]
    exact = reference.moe_mlp(x, w, idx, (deq[0], deq[1]), deq[2], "silu")
    twin = moe_mlp_w8a8(x, w, idx, gu, d, "silu", scales)
    _close(twin, exact, 0.05)
    assert not torch.equal(twin, exact)  # the activations were quantized


@kernel_test
@pytest.mark.parametrize(
    ("rows", "experts", "hidden", "inter", "top_k"),
    [(5, 8, 256, 128, 2), (9, 6, 200, 72, 3), (33, 4, 136, 96, 2)],  # awkward K: 200, 72, 136
)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("swap", [True, False])
def test_kernel_matches_twin(rows, experts, hidden, inter, top_k, activation, swap):
    dtype = torch.bfloat16 if CUDA else torch.float32
    case = _case(rows, experts, hidden, inter, top_k, dtype, seed=rows)
    got = _kernel(*case[:5], activation, case[5], bn=HIDDEN_GROUP, swap=swap)
    _close(got, _twin(*case[:5], activation, case[5]), TOL)


@kernel_test
@pytest.mark.parametrize("where", ["one_expert", "zero_rows"])
def test_kernel_routing_extremes(where):
    """All rows on one expert (many tiles of it); most experts with no rows (never read)."""
    rows, experts, top_k = 40, 8, 2
    if where == "one_expert":
        index = torch.stack([torch.full((rows,), 3), torch.full((rows,), 5)], 1)
    else:
        index = torch.randint(6, 8, (rows, top_k))
    dtype = torch.bfloat16 if CUDA else torch.float32
    case = _case(rows, experts, 128, 64, top_k, dtype, index=index)
    add = torch.randn(rows, 128, device=DEV).to(dtype)
    got = _kernel(*case[:5], "silu", case[5], bn=HIDDEN_GROUP, bm=16, add=add)
    want = _twin(*case[:5], "silu", case[5]) + add.float().cpu()
    _close(got, want, TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 7, 32, 256, 512])
def test_kernel_matches_twin_at_block_sizes(rows):
    case = _case(rows, 16, 512, 192, 4, torch.bfloat16, seed=rows)
    got = moe_mlp_w8a8(*case[:5], "gelu_tanh", case[5])  # the op: the kernel on CUDA
    _close(got, _twin(*case[:5], "gelu_tanh", case[5]), TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_kernel_is_capturable_and_replays_the_eager_bits():
    case = _case(32, 16, 512, 192, 4, torch.bfloat16, seed=3)
    eager = moe_mlp_w8a8(*case[:5], "silu", case[5])
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        out = moe_mlp_w8a8(*case[:5], "silu", case[5])
    graph.replay()
    assert torch.equal(out, eager)


def test_groups_match_the_kernel():
    pytest.importorskip("triton")
    from dlmrt._kernels import moe_mlp_fp8

    assert moe_mlp_fp8.GROUP == X_GROUP
