"""MoE kernels (routing, grouped expert MLP) vs their torch twins, and CUDA-graph capture.

Device machine: `pytest -m gpu tests/ops/test_moe_gpu.py`. Without CUDA, TRITON_INTERPRET=1 runs the
kernel tests on CPU tensors (small shapes; the interpreter's bf16 tl.dot is broken, so bf16 MLP
cases and the capture tests need CUDA).
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import capture_guard, ops
from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini
from dlmrt.ops import reference

pytestmark = [pytest.mark.gpu, kernel_test]
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
ROWS = [1, 7, 32, 256]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def _grid_logits(rows: int, experts: int, step: float, gen) -> torch.Tensor:
    """Logits on a grid of `step`: values are exactly equal (a tie: lowest id must win) or far
    apart (no rounding of exp / sigmoid can reorder them), so selections must match exactly."""
    return torch.randint(-48, 48, (rows, experts), device=DEV, generator=gen).float() * step


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(
    "experts,n_group,topk_group,top_k",
    [(256, 8, 4, 8), (64, 8, 3, 6), (48, 4, 2, 1), (24, 4, 4, 8)],
)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("step", [1 / 16, 1 / 2])  # 1/2: many ties
def test_route_grouped_matches_twin(rows, experts, n_group, topk_group, top_k, bias, step):
    from dlmrt._kernels.moe_route import moe_route_grouped

    gen = _gen(rows + experts + top_k)
    logits = _grid_logits(rows, experts, step, gen)
    b = torch.randint(-4, 4, (experts,), device=DEV, generator=gen).float() / 8 if bias else None
    args = (logits, b, n_group, topk_group, top_k, True, 2.5)
    weights, index = moe_route_grouped(*args)
    want_w, want_i = reference.moe_route_grouped(*args, stable=True)
    assert torch.equal(index, want_i)
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("experts,top_k", [(128, 8), (100, 8), (4, 2), (128, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_softmax_matches_twin(rows, experts, top_k, dtype):
    """bf16 logits tie often: the lowest id must win, as in the twin."""
    from dlmrt._kernels.moe_route import moe_route_softmax

    gen = _gen(rows * experts + top_k)
    logits = _grid_logits(rows, experts, 1 / 8, gen).to(dtype)
    pes = (0.5 + torch.rand(experts, device=DEV, generator=gen)).to(dtype)
    weights, index = moe_route_softmax(logits, pes, top_k)
    want_w, want_i = reference.moe_route_softmax(logits, pes, top_k, stable=True)
    assert torch.equal(index, want_i)
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-6)


def _moe_inputs(rows, experts, hidden, inter, top_k, hits, dtype, seed):
    """Routing with a chosen hit pattern: "random", "one" (expert 3 in every row: many tiles of
    one expert, most experts never hit), "spread" (each expert at most once, when possible)."""
    gen = _gen(seed)
    x = torch.randn(rows, hidden, device=DEV, generator=gen).to(dtype)
    perms = [torch.randperm(experts, device=DEV, generator=gen)[:top_k] for _ in range(rows)]
    index = torch.stack(perms)
    if hits == "one":
        index = torch.where(index == 3, index[:, :1], index)  # keep ids distinct per row
        index[:, 0] = 3
    elif hits == "spread":
        index = torch.arange(rows * top_k, device=DEV).view(rows, top_k) % experts
    weights = torch.rand(rows, top_k, device=DEV, generator=gen)
    gate_up = (torch.randn(experts, 2 * inter, hidden, device=DEV, generator=gen) / hidden**0.5).to(
        dtype
    )
    down = (torch.randn(experts, hidden, inter, device=DEV, generator=gen) / inter**0.5).to(dtype)
    return x, weights, index, gate_up, down


def _check_mlp(args, activation, split, dtype, swap=False):
    from dlmrt._kernels.moe_mlp import moe_mlp

    x, weights, index, gate_up, down = args
    inter = down.shape[2]
    gu = (gate_up[:, :inter], gate_up[:, inter:]) if split else gate_up
    got = moe_mlp(x, weights, index, gu, down, activation, swap=swap)
    want = reference.moe_mlp(x, weights, index, gu, down, activation)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=3e-5, rtol=3e-5)
    else:  # bf16: roundings of 8 expert outputs summed in a different order
        scale = want.float().abs().max().item()
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2 * scale, rtol=2e-2)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hits", ["random", "one", "spread"])
@pytest.mark.parametrize("activation,split", [("silu", True), ("gelu_tanh", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("swap", [False, True])
def test_moe_mlp_matches_twin(rows, hits, activation, split, dtype, swap):
    """Awkward sizes: hidden and inter not multiples of the 64-wide tiles, 24 experts, top-6;
    both accumulator orientations (`swap`: acc^T = W a^T)."""
    if dtype == torch.bfloat16 and not CUDA:
        pytest.skip("the Triton interpreter's bf16 tl.dot is broken")
    args = _moe_inputs(rows, 24, 200, 72, 6, hits, dtype, seed=rows + len(hits))
    _check_mlp(args, activation, split, dtype, swap)


def _real_moe(name: str) -> tuple[int, int, int, int, int]:
    """(rows, experts, hidden, expert width, top-k) of a released model's MoE layer."""
    if name == "llada2.1-mini":
        c = llada21_mini()
        return c.block_size, c.num_experts, c.hidden_size, c.moe_intermediate_size, c.top_k
    c = diffusion_gemma_26b()
    return c.canvas_length, c.num_experts, c.hidden_size, c.moe_intermediate_size, c.top_k_experts


@needs_cuda
@pytest.mark.parametrize(
    "name,activation,split",
    [("llada2.1-mini", "silu", True), ("diffusiongemma-26b", "gelu_tanh", False)],
    ids=["llada2.1-mini", "diffusiongemma-26b"],
)
def test_moe_mlp_real_shapes_bf16(name, activation, split):
    rows, experts, hidden, inter, top_k = _real_moe(name)
    args = _moe_inputs(rows, experts, hidden, inter, top_k, "random", torch.bfloat16, seed=rows)
    _check_mlp(args, activation, split, torch.bfloat16)


def _llada_layer(x, logits_w, bias, gate_up, down):
    weights, index = ops.moe_route_grouped(x.float() @ logits_w.T, bias, 8, 4, 8, True, 2.5)
    return ops.moe_mlp(x, weights, index, gate_up, down, "silu")


def _gemma_layer(x, logits_w, pes, gate_up, down):
    weights, index = ops.moe_route_softmax(x @ logits_w.T, pes, 8)
    return ops.moe_mlp(x, weights, index, gate_up, down, "gelu_tanh", sum_dtype=x.dtype)


@needs_cuda
@pytest.mark.parametrize("family", ["llada", "gemma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_layer_captured_in_a_cuda_graph_replays_eager_bits(family, dtype):
    """Routing + experts captured once; replays on new inputs give eager's output bit for bit
    (device-side grouping, no host sync, no atomics)."""
    rows, experts, hidden, inter = (32, 64, 256, 96) if family == "llada" else (256, 32, 192, 80)
    gen = _gen(7)
    x, _, _, gate_up, down = _moe_inputs(rows, experts, hidden, inter, 8, "random", dtype, 3)
    router = torch.randn(experts, hidden, device=DEV, generator=gen).to(dtype)
    if family == "llada":
        extra, layer = 0.1 * torch.randn(experts, device=DEV, generator=gen), _llada_layer
        router = router.float()
        gate_up = (gate_up[:, :inter], gate_up[:, inter:])
    else:
        extra, layer = (
            (0.5 + torch.rand(experts, device=DEV, generator=gen)).to(dtype),
            _gemma_layer,
        )
    ops.use("triton")
    try:
        static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compile the kernels outside the capture
            layer(static_x, router, extra, gate_up, down)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with capture_guard.graph(graph):
            static_out = layer(static_x, router, extra, gate_up, down)
        for seed in (1, 2):
            new_x = torch.randn(x.shape, device=DEV, generator=_gen(seed)).to(dtype)
            static_x.copy_(new_x)
            graph.replay()
            eager = layer(new_x, router, extra, gate_up, down)
            assert torch.equal(static_out, eager)
    finally:
        ops.use(None)


@pytest.mark.parametrize(
    "rows,top_k,experts",
    [
        (1, 1, 4),
        (7, 3, 16),
        (32, 8, 256),
        (96, 8, 128),
        (600, 6, 64),
        (256, 8, 128),
        (2100, 8, 128),
        (1024, 8, 256),  # LLaDA2's 1,024-row prefill: the chunked plan's largest scan tile
        (2048, 8, 256),  # a 2,048-row one: the sort (the scan tile would overflow shared memory)
    ],
)
@pytest.mark.parametrize("hits", ["random", "one", "spread"])
def test_single_program_plan_equals_the_sort_plan(rows, top_k, experts, hits, monkeypatch):
    """moe_plan's one-launch grouping and its chunked (multi-program) grouping == the torch sort
    plan, field for field (DiffusionGemma's 2,048 pairs; 16,800 pairs falling back to the sort)."""
    from dlmrt._kernels import moe_mlp

    gen = torch.Generator(DEV).manual_seed(rows)
    index = torch.stack(
        [torch.randperm(experts, device=DEV, generator=gen)[:top_k] for _ in range(rows)]
    )
    if hits == "one":
        index[:, 0] = 2
        index = torch.where((index == 2) & (torch.arange(top_k, device=DEV) > 0), 3, index)
    elif hits == "spread":
        index = torch.arange(rows * top_k, device=DEV).view(rows, top_k) % experts
    from dlmrt._kernels import moe_plan

    fast = moe_mlp.plan(index, experts)
    single = moe_plan.plan_small(index, experts, moe_mlp.BLOCK_M)  # at every size it may serve
    plans = [fast[:4], single]
    # the chunked plan at every size it may serve: also below MAX_PAIRS, where its tile fits
    if moe_plan.chunked_fits(max(index.numel(), moe_plan.MAX_PAIRS + 1), experts, index.device):
        plans.append(moe_plan.plan_chunked(index, experts, moe_mlp.BLOCK_M))
    monkeypatch.setattr(moe_mlp, "MAX_PAIRS", 0)
    monkeypatch.setattr(moe_mlp, "chunked_fits", lambda *args: False)
    slow = moe_mlp.plan(index, experts)
    assert fast[4] == slow[4]
    for got in plans:
        for a, b in zip(got, slow[:4], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("rows,top_k,hidden", [(1, 1, 8), (7, 8, 1500), (256, 8, 2816)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slot_sum_is_the_slot_order_sum(rows, top_k, hidden, dtype):
    """The experts' k-slot sum: fp32 in slot order, one cast (bit for bit that loop)."""
    from dlmrt._kernels.slot_sum import slot_sum

    if dtype == torch.bfloat16 and not CUDA:
        pytest.skip("the interpreter's bf16 casts are not the GPU's")
    y = torch.randn(rows, top_k, hidden, device=DEV, generator=_gen(rows + hidden))
    want = y[:, 0].clone()
    for s in range(1, top_k):
        want += y[:, s]
    got = slot_sum(y, dtype)
    assert got.dtype == dtype and got.shape == (rows, hidden)
    assert torch.equal(got, want.to(dtype))
    # the shared experts' output added in the same pass: rounded as torch's add in the dtype
    shared = torch.randn(rows, hidden + 3, device=DEV, generator=_gen(rows))[:, 3:].to(dtype)
    assert torch.equal(slot_sum(y, dtype, shared), want.to(dtype) + shared)
    with pytest.raises(ValueError, match="slot_sum: add must be"):
        slot_sum(y, dtype, shared.float() if dtype != torch.float32 else shared.double())
