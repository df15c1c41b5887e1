"""DiffusionGemma's vocabulary pass over rows x vocabulary splits (kernels/canvas_vocab_split.py)
against the one-program-per-row kernel (kernels/canvas_vocab.py) and the twin
(`dlmrt/ops/vocab.py`): fp32 under TRITON_INTERPRET=1 on CPU tensors (64-wide blocks, so small
vocabularies span several blocks and splits), bf16 and fp32 on a GPU (`-m gpu`).

Exact: the argmax (first index among ties), and the sample wherever u * total is not within
rounding of a step of the cumulative sum. Within the order of fp32 additions: the entropy and the
self-conditioning probabilities (totals summed per split, then over splits)."""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import capture_guard, ops
from dlmrt.ops import vocab

CAP = 30.0


def _inputs(rows: int, v: int, seed: int, t: float, dtype=torch.float32):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    raw = 3 * torch.randn(rows, v, device=DEV, generator=gen)
    raw[0, v // 3] = raw[0].max() + 0  # a tie with the first maximum's later copy
    raw[0, v - 1] = raw[0, v // 3]
    u = torch.rand(rows, device=DEV, generator=gen)
    u[-1] = 0.9999999  # the clamp at V - 1 in reach
    return raw.to(dtype), torch.tensor(t, device=DEV), u


def _draw_window(raw, cap, t, u, tol: float = 1e-5):
    """Per row, the tokens a draw at u +- tol would give (float64 CDF): (lo, hi); lo == hi where
    the draw is not on a boundary, so any correct kernel gives exactly that token."""
    z = vocab.softcapped(raw, cap).double() / t.double()
    cdf = torch.cumsum(torch.softmax(z, -1), -1)
    v = raw.shape[-1]
    lo = torch.searchsorted(cdf, (u.double() - tol).clamp(min=0)[:, None], right=True)[:, 0]
    hi = torch.searchsorted(cdf, (u.double() + tol)[:, None], right=True)[:, 0]
    return lo.clamp(max=v - 1), hi.clamp(max=v - 1)


def _check(got, want, raw, cap, t, u, atol: float = 2e-6, exact_rows_needed: bool = True) -> None:
    """`got` (split kernel) against `want` (one-program kernel or twin): argmax exact; the sample
    exact off the boundaries, inside the window on them; entropy within `atol` (the one-program
    kernel: fp32 re-association; the twin: its own formula, kernels/canvas_vocab.py's bound)."""
    assert torch.equal(got[0], want[0])
    lo, hi = _draw_window(raw, cap, t, u)
    off = lo == hi
    assert torch.equal(got[2][off], want[2][off]) and torch.equal(got[2][off], lo[off])
    assert ((got[2] >= lo) & (got[2] <= hi)).all()
    if exact_rows_needed:
        assert off.sum() >= raw.shape[0] - 1  # the exact comparison is not vacuous
    torch.testing.assert_close(got[1], want[1], atol=atol, rtol=1e-4)


# (rows, vocab, splits, cap, T): vocabularies not multiples of the 64-wide block, a split count
# past the blocks (clamped), near-greedy T (most probabilities underflow to 0) and T > 1
CASES = [
    (1, 37, None, CAP, 0.7),
    (3, 300, None, CAP, 0.7),
    (3, 300, 2, None, 1.5),
    (4, 1000, 3, CAP, 0.05),
    (2, 129, 64, CAP, 1.0),
    (5, 200, None, None, 0.3),
]


@kernel_test
@pytest.mark.parametrize("rows,v,splits,cap,t", CASES)
def test_split_matches_the_one_program_kernel_and_the_twin(rows, v, splits, cap, t):
    from dlmrt._kernels import canvas_vocab, canvas_vocab_split

    raw, temp, u = _inputs(rows, v, rows * v, t)
    sc, sc_rows, sc_twin = (torch.empty(rows, v, device=DEV) for _ in range(3))
    got = canvas_vocab_split.canvas_vocab(raw, cap, temp, u, sc, splits=splits)
    rows_kernel = canvas_vocab.canvas_vocab(raw, cap, temp, u, sc_rows)
    twin = vocab.canvas_vocab(raw, cap, temp, u, sc_twin)
    _check(got, rows_kernel, raw, cap, temp, u)
    _check(got, twin, raw, cap, temp, u, atol=2e-4)
    torch.testing.assert_close(sc, sc_rows, rtol=1e-5, atol=1e-12)
    torch.testing.assert_close(sc, sc_twin, rtol=2e-4, atol=1e-9)  # the twin's softmax: as before


@kernel_test
def test_exact_counts_across_split_boundaries():
    """Equal logits: every e^(z - M) is 1, so the totals and cumulative sums are exact integers in
    any order and the sample must be exactly floor(target), including draws in the last entry of
    a split, the first of the next and the clamp at V - 1 (u = 1); a tie of the maximum across
    two splits gives the first index."""
    from dlmrt._kernels.canvas_vocab_split import canvas_vocab

    v, span = 300, 128  # splits=3 of 128, 128, 44 entries (64-wide blocks)
    ks = [0, 127, 128, 129, 255, 256, 298]
    rows = len(ks) + 2
    raw = torch.full((rows, v), 2.0, device=DEV)
    raw[-1] = torch.linspace(-1, 1, v, device=DEV)
    raw[-1, 100] = raw[-1, 280] = 5.0  # the maximum in split 0 and again in split 2
    u = torch.tensor([(k + 0.5) / v for k in ks] + [1.0, 0.5], device=DEV)
    sc = torch.empty(rows, v, device=DEV)
    argmax, entropy, sampled = canvas_vocab(raw, CAP, torch.tensor(1.0, device=DEV), u, sc, 3)
    assert triton_span(v, 3) == span
    assert sampled[: len(ks)].tolist() == ks and sampled[len(ks)].item() == v - 1
    assert argmax[:-1].eq(0).all() and argmax[-1].item() == 100
    log_v = torch.log(torch.tensor(float(v), device=DEV))
    torch.testing.assert_close(entropy[:-1], log_v.expand(rows - 1), atol=1e-5, rtol=0)
    torch.testing.assert_close(sc[:-1], torch.full_like(sc[:-1], 1 / v), rtol=4e-6, atol=0)


def triton_span(v: int, splits: int) -> int:
    """The span the launcher gives an explicit split count on the CPU (64-wide blocks)."""
    import triton

    return triton.cdiv(triton.cdiv(v, 64), splits) * 64


def test_launch_shape_fills_the_sms():
    """DiffusionGemma's canvas on an H100 (256 rows x 262,144, 132 SMs): 5 splits of 26 blocks,
    1,280 programs; every split holds entries; a vocabulary of one block or many rows: 1 split."""
    pytest.importorskip("triton")
    from dlmrt._kernels.canvas_vocab_split import launch_shape

    assert launch_shape(256, 262_144, 132, 2048) == (5, 26 * 2048)
    for rows, v, sms in [(256, 262_144, 132), (7, 300, 4), (32, 4096, 114), (1, 37, 132)]:
        splits, span = launch_shape(rows, v, sms, 64)
        assert (splits - 1) * span < v <= splits * span and span % 64 == 0
        assert rows * splits >= min(2 * sms, rows * -(-v // 64))  # >= 2 waves where blocks allow
    assert launch_shape(4, 2048, 132, 2048) == (1, 2048)
    assert launch_shape(4096, 262_144, 132, 2048) == (1, 262_144)


def test_bad_kernel_name_and_split_count():
    raw, temp, u = _inputs(2, 40, 0, 1.0)
    with pytest.raises(ValueError, match="kernel 'rowz'"):
        ops.canvas_vocab(raw, CAP, temp, u, torch.empty_like(raw), kernel="rowz")
    pytest.importorskip("triton")
    from dlmrt._kernels.canvas_vocab_split import canvas_vocab

    with pytest.raises(ValueError, match="splits must be >= 1, got 0"):
        canvas_vocab(raw, CAP, temp, u, torch.empty_like(raw), splits=0)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rows,v", [(1, 37), (7, 300), (32, 4096), (256, 262144)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_split_matches_the_one_program_kernel(rows, v, dtype):
    """The model dtype's raw logits and sc; the default split count (the device's SMs)."""
    from dlmrt._kernels import canvas_vocab, canvas_vocab_split

    raw, temp, u = _inputs(rows, v, rows + v, 0.8, dtype)
    sc = torch.empty(rows, v, device=DEV, dtype=dtype)
    sc_rows = torch.empty_like(sc)
    got = canvas_vocab_split.canvas_vocab(raw, CAP, temp, u, sc)
    want = canvas_vocab.canvas_vocab(raw, CAP, temp, u, sc_rows)
    _check(got, want, raw, CAP, temp, u, atol=2e-4, exact_rows_needed=False)
    if rows >= 32:  # most draws are off the boundaries
        assert (got[2] == want[2]).float().mean() >= 0.95
    ratio = (sc.float() + 1e-30) / (sc_rows.float() + 1e-30)
    assert (ratio - 1).abs().max() < (1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_split_replays_identically_in_a_graph():
    """Captured (as the step's graphs capture it): the integer atomics of the sample and every
    other output are the same on every replay."""
    from dlmrt._kernels.canvas_vocab_split import canvas_vocab

    raw, temp, u = _inputs(256, 262_144, 3, 0.8, torch.bfloat16)
    sc = torch.empty_like(raw)
    canvas_vocab(raw, CAP, temp, u, sc)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        out = canvas_vocab(raw, CAP, temp, u, sc)
    graph.replay()
    first = [t.clone() for t in (*out, sc)]
    for _ in range(5):
        graph.replay()
        assert all(torch.equal(a, b) for a, b in zip(first, (*out, sc), strict=True))
    want = canvas_vocab(raw, CAP, temp, u, torch.empty_like(sc))
    assert torch.equal(first[2], want[2]) and torch.equal(first[0], want[0])
