"""MoE twins on the CPU: the tie rule, and the ops give today's model numbers bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlmrt import ops
from dlmrt.ops import reference


def _old_route_grouped(logits, bias, n_group, topk_group, top_k, norm, scaling):
    """The routing as it was before the tie rule (torch.topk), for the no-tie equality check."""
    scores = torch.sigmoid(logits.float())
    biased = scores if bias is None else scores + bias
    rows, experts = biased.shape
    grouped = biased.view(rows, n_group, experts // n_group)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(topk_group, dim=-1).indices, True)
    allowed = keep.unsqueeze(-1).expand_as(grouped).reshape(rows, experts)
    index = biased.masked_fill(~allowed, float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, index)
    if norm and top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, index


def _old_gemma_experts(x, weights, index, gate_up, down):
    out = torch.zeros_like(x)
    for e in index.unique().tolist():
        rows, slot = torch.where(index == e)
        gate, up = F.linear(x[rows], gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.gelu(gate, approximate="tanh") * up, down[e])
        out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
    return out


def _old_swiglu(x, weights, index, gate, up, down):
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in index.unique().tolist():
        rows, slot = torch.where(index == e)
        xe = x[rows]
        y = F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e])
        out.index_add_(0, rows, y.float() * weights[rows, slot, None].float())
    return out.to(x.dtype)


def test_topk_first_breaks_ties_by_lowest_index():
    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0, 0.0]])
    values, index = reference.topk_first(x, 4)
    assert index.tolist() == [[1, 3, 4, 2]] and values.tolist() == [[3.0, 3.0, 3.0, 2.0]]


def test_route_grouped_is_todays_code_and_stable_gives_lowest_id_on_ties():
    gen = torch.Generator().manual_seed(0)
    logits, bias = torch.randn(9, 64, generator=gen), 0.1 * torch.randn(64, generator=gen)
    for top_k, norm in ((6, True), (1, True), (4, False)):
        want = _old_route_grouped(logits, bias, 8, 3, top_k, norm, 2.5)
        for stable in (False, True):
            got = reference.moe_route_grouped(logits, bias, 8, 3, top_k, norm, 2.5, stable)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # stable: all equal -> groups 0 and 1 kept (lowest ids), experts in ascending order
    _, index = reference.moe_route_grouped(torch.zeros(2, 16), None, 4, 2, 3, True, 1.0, True)
    assert index.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_route_softmax_matches_softmax_topk_and_ties_pick_lowest_id():
    gen = torch.Generator().manual_seed(1)
    logits, pes = torch.randn(7, 16, generator=gen), torch.rand(16, generator=gen) + 0.5
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    w, i = torch.topk(probs, 4, dim=-1)
    want = (w / w.sum(-1, keepdim=True) * pes[i], i)
    for stable in (False, True):
        got = reference.moe_route_softmax(logits, pes, 4, stable)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    tied = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0]])
    weights, index = reference.moe_route_softmax(tied, torch.ones(5), 2, stable=True)
    assert index.tolist() == [[1, 3]]
    torch.testing.assert_close(weights, torch.tensor([[0.5, 0.5]]))


def _experts(dtype, e=6, h=24, i=10, rows=9, k=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h, generator=gen).to(dtype)
    index = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(rows)])
    weights = torch.rand(rows, k, generator=gen)
    gate_up = torch.randn(e, 2 * i, h, generator=gen).to(dtype)
    down = torch.randn(e, h, i, generator=gen).to(dtype)
    return x, weights, index, gate_up, down


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_mlp_twin_is_bit_identical_to_the_family_loops(dtype):
    x, weights, index, gate_up, down = _experts(dtype)
    got = ops.moe_mlp(x, weights, index, gate_up, down, "gelu_tanh", sum_dtype=x.dtype)
    assert torch.equal(got, _old_gemma_experts(x, weights, index, gate_up, down))
    gate, up = gate_up.chunk(2, dim=1)
    got = ops.moe_mlp(x, weights, index, (gate, up), down, "silu")
    assert torch.equal(got, _old_swiglu(x, weights, index, gate, up, down))


def test_moe_ops_on_cpu_run_the_twins_even_when_triton_is_forced():
    x, weights, index, gate_up, down = _experts(torch.float32)
    want = reference.moe_mlp(x, weights, index, gate_up, down, "silu")
    ops.use("triton")  # CPU tensors never reach a kernel (and need no triton install)
    try:
        assert torch.equal(ops.moe_mlp(x, weights, index, gate_up, down, "silu"), want)
        logits = torch.randn(3, 16)
        want_r = reference.moe_route_grouped(logits, None, 4, 2, 2, True, 1.0)
        got_r = ops.moe_route_grouped(logits, None, 4, 2, 2, True, 1.0)
        assert all(torch.equal(a, b) for a, b in zip(got_r, want_r))
        got_s = ops.moe_route_softmax(logits, torch.ones(16), 2)
        want_s = reference.moe_route_softmax(logits, torch.ones(16), 2)
        assert all(torch.equal(a, b) for a, b in zip(got_s, want_s))
    finally:
        ops.use(None)


def test_moe_mlp_adds_the_shared_output_as_the_separate_add_did():
    """`add` (the shared experts' output) = the routed sum + add in x's dtype, on every path."""
    x, weights, index, gate_up, down = _experts(torch.bfloat16)
    shared = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    want = ops.moe_mlp(x, weights, index, gate_up, down, "silu") + shared
    assert torch.equal(ops.moe_mlp(x, weights, index, gate_up, down, "silu", add=shared), want)


def test_the_chunked_plan_only_where_its_scan_tile_fits():
    """kernels/moe_plan.py: the chunked plan's scan program holds chunks x experts int32 in
    shared memory; past the device's (Hopper's 227 KiB: LLaDA2's 256 experts at a 2,048-row
    prefill) the sort runs."""
    pytest.importorskip("triton")
    from dlmrt._kernels.moe_plan import MAX_PAIRS, chunked_fits

    cpu = torch.device("cpu")  # the interpreter: Hopper's shared memory
    assert not chunked_fits(MAX_PAIRS, 256, cpu)  # the single program's
    assert chunked_fits(MAX_PAIRS + 1, 256, cpu)
    assert chunked_fits(1024 * 8, 256, cpu) and not chunked_fits(2048 * 8, 256, cpu)
    assert chunked_fits(2048 * 8, 128, cpu)  # DiffusionGemma's 128 experts: 256 x 128
    assert not chunked_fits(2048 * 8 + 1, 2, cpu)  # above MAX_CHUNKED_PAIRS
