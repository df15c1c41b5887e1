"""The DeepGEMM benchmark's host-side pieces on the CPU (benchmarks/deepgemm/): the shape table,
the torch twins of DeepGEMM's FP8 casts (bit for bit against DeepGEMM's own helpers where
stage.sh has staged them), the two expert layouts, and the grouped calls + their checks through
a stand-in library implementing the documented contracts (csrc/apis/gemm.hpp)."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest
import torch
from benchmark_modules import benchmark

cases = benchmark("deepgemm.cases")
quant = benchmark("deepgemm.quant")
layouts = benchmark("deepgemm.layouts")
grouped = benchmark("deepgemm.grouped")
shapes = benchmark("deepgemm.shapes")

STAGED = Path(__file__).resolve().parents[2] / ".deepgemm/DeepGEMM/deep_gemm/utils/math.py"


def test_every_family_and_projection_is_listed():
    table = {d.name: (d.n, d.k) for d in cases.dense_shapes()}
    assert {d.family for d in cases.dense_shapes()} == set(cases.FAMILY_ROWS)
    assert table["llada2.qkv"] == ((16 + 2 * 4) * 128, 2048)
    assert table["llada2.shared_down"] == (2048, 512)
    assert table["qwen_dlm.down"] == (2560, 9728)
    assert table["diffusion_gemma.o_full"] == (2816, 16 * 512)
    shape = next(d for d in cases.dense_shapes() if d.name == "llada2.o")
    assert cases.dense_rows(shape, None) == [32, 1, 7]
    assert cases.dense_rows(shape, [64]) == [64]
    assert [f for f, _ in cases.expert_shapes()] == ["llada2", "diffusion_gemma"]


def test_tasks_follow_the_flags():
    ns = types.SimpleNamespace(
        families=["llada2"], only=["llada2.o"], rows=None, kinds=["bf16", "fp8"],
        experts=True, layouts=["masked"],
    )  # fmt: skip
    got = shapes.tasks(ns)
    dense = [t for t in got if t[0] == "dense"]
    assert len(dense) == 6 and {t[2] for t in dense} == {32, 1, 7}
    assert [t for t in got if t[0] == "experts"] == [
        ("experts", "llada2", "bf16", "masked"),
        ("experts", "llada2", "fp8", "masked"),
    ]


def _awkward(*shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g)
    x[..., :5] *= 50  # a wide range inside one 128-column group
    return x.bfloat16()


@pytest.mark.parametrize("shape", [(7, 200), (3, 5, 256), (1, 128)])
def test_token_cast_round_trips_within_e4m3(shape):
    x = _awkward(*shape)
    q, sf = quant.per_token_cast(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert sf.shape == (*shape[:-1], -(-shape[-1] // 128)) and sf.dtype == torch.float32
    back = quant.dequant_tokens(q, sf)
    # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of the value; the group's amax maps to 448
    assert float((back - x.float()).abs().max()) <= float(sf.max()) * 448 / 16 + 1e-6
    assert quant.rel_error(back, x.float()) < 0.05


@pytest.mark.parametrize("shape", [(130, 200), (2, 256, 384)])
def test_block_cast_round_trips_within_e4m3(shape):
    w = _awkward(*shape)
    q, sf = quant.per_block_cast(w)
    assert sf.shape == (*shape[:-2], -(-shape[-2] // 128), -(-shape[-1] // 128))
    assert quant.rel_error(quant.dequant_blocks(q, sf), w.float()) < 0.05
    assert quant.calc_diff(quant.dequant_blocks(q, sf), w.float()) < 1e-3


def test_reference_is_the_dequantized_product():
    a, b = quant.per_token_cast(_awkward(5, 256)), quant.per_block_cast(_awkward(140, 256))
    want = quant.dequant_tokens(*a) @ quant.dequant_blocks(*b).t()
    assert torch.equal(quant.reference_fp8(a, b), want)
    assert quant.rel_error(want * 1.01, want) == pytest.approx(0.01, rel=1e-4)


@pytest.mark.skipif(not STAGED.exists(), reason="run benchmarks/deepgemm/stage.sh first")
@pytest.mark.parametrize("shape", [(7, 200), (256, 2816), (130, 384)])
def test_twins_equal_deepgemms_helpers_bit_for_bit(shape):
    """quant.py against deep_gemm/utils/math.py as staged (a torch-only module)."""
    spec = importlib.util.spec_from_file_location("staged_deep_gemm_math", STAGED)
    theirs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(theirs)
    x = _awkward(*shape)
    for mine, ref in (
        (quant.per_token_cast(x), theirs.per_token_cast_to_fp8(x, use_ue8m0=False)),
        (quant.per_block_cast(x), theirs.per_block_cast_to_fp8(x, use_ue8m0=False)),
    ):
        assert torch.equal(mine[0].view(torch.uint8), ref[0].view(torch.uint8))
        assert torch.equal(mine[1], ref[1])


def _routing(rows=9, experts=6, top_k=3, touched=None):
    gen = torch.Generator().manual_seed(rows)
    index = layouts.uniform_index(rows, experts, top_k, touched, gen)
    return index, layouts.route(index, experts)


def test_uniform_index_is_distinct_per_row_and_respects_touched():
    index, r = _routing(rows=50, experts=16, top_k=4, touched=5)
    assert all(len(set(row)) == 4 for row in index.tolist())
    assert int(index.max()) < 5 and int(r.counts.sum()) == 200 and r.counts.dtype == torch.int32
    with pytest.raises(ValueError, match="touched=2"):
        layouts.uniform_index(4, 16, 3, 2, torch.Generator())


def test_masked_layout_puts_each_pair_in_its_experts_rows():
    index, r = _routing()
    x = torch.randn(9, 16)
    a, masked_m = layouts.masked(x, r, layouts.capacity(9))
    assert a.shape == (6, 256, 16) and torch.equal(masked_m, r.counts)
    for row, experts in enumerate(index.tolist()):
        for e in experts:
            slots = [j for j in range(int(masked_m[e])) if torch.equal(a[e, j], x[row])]
            assert len(slots) == 1
    for e in range(6):
        assert not a[e, int(masked_m[e]) :].any()  # padding rows zero
    with pytest.raises(ValueError, match="capacity 1"):
        layouts.masked(x, r, 1)


def test_contiguous_layout_segments_are_aligned_and_labelled():
    index, r = _routing()
    x = torch.randn(9, 16)
    a, layout, pos = layouts.contiguous(x, r, 4)
    counts = r.counts.tolist()
    assert a.shape[0] == sum(-(-c // 4) * 4 for c in counts)
    assert torch.equal(a[pos], x[r.row]) and torch.equal(layout[pos], r.expert.int())
    start = 0
    for e, c in enumerate(counts):  # one aligned segment per expert with pairs, in expert order
        seg = -(-c // 4) * 4
        assert (
            layout[start : start + c].eq(e).all() and layout[start + c : start + seg].eq(-1).all()
        )
        start += seg


def fake_library(wrong_expert: bool = False) -> types.SimpleNamespace:
    """The grouped calls' contracts in torch (D = A @ B[g]^T on the valid rows; FP8 operands as
    (codes, scales) pairs, dequantized the documented way); `wrong_expert` multiplies by the next
    expert's weight (the checks must catch it)."""
    shift = 1 if wrong_expert else 0

    def deq(t, weight=False):
        return t.float() if not isinstance(t, tuple) else (
            quant.dequant_blocks(*t) if weight else quant.dequant_tokens(*t)
        )  # fmt: skip

    def masked(a, b, d, masked_m, expected_m, **kw):
        a, b = deq(a), deq(b, weight=True)
        assert expected_m > 0 and masked_m.dtype == torch.int32
        for g, m in enumerate(masked_m.tolist()):
            d[g, :m] = (a[g, :m] @ b[(g + shift) % b.shape[0]].t()).to(d.dtype)

    def contiguous(a, b, d, grouped_layout, **kw):
        a, b = deq(a), deq(b, weight=True)
        for i, g in enumerate(grouped_layout.tolist()):
            if g >= 0:
                d[i] = (a[i] @ b[(g + shift) % b.shape[0]].t()).to(d.dtype)

    return types.SimpleNamespace(
        m_grouped_bf16_gemm_nt_masked=masked, m_grouped_fp8_gemm_nt_masked=masked,
        m_grouped_bf16_gemm_nt_contiguous=contiguous, m_grouped_fp8_gemm_nt_contiguous=contiguous,
        get_mn_major_tma_aligned_tensor=lambda sf: sf,
        get_theoretical_mk_alignment_for_contiguous_layout=lambda: 8,
        set_mk_alignment_for_contiguous_layout=lambda v: None,
        get_mk_alignment_for_contiguous_layout=lambda: 8,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("layout", ["masked", "contiguous"])
def test_grouped_calls_and_their_checks(kind, layout):
    """Through the stand-in: the right rows and experts reach the call and the check passes
    within bf16 rounding; the next expert's weight instead fails it by far."""
    _, r = _routing(rows=9, experts=6, top_k=3)
    src = torch.randn(9, 256).bfloat16()
    w = (torch.randn(6, 128, 256) / 16).bfloat16()
    for wrong, bound in ((False, lambda e: e < 1e-2), (True, lambda e: e > 0.5)):
        gemm = grouped._grouped(fake_library(wrong), kind, layout, src, r, w, 256, 2)
        gemm.call()
        err = gemm.check()
        assert bound(err), (wrong, err)
