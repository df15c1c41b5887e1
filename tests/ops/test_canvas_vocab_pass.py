"""DiffusionGemma's step vocabulary in one pass (kernels/canvas_vocab_pass.py): the twin
(`ops.vocab.canvas_vocab_pass`) is the three steps op for op (CPU); the kernel against the twin in
fp32 under TRITON_INTERPRET=1 (awkward vocabularies and widths, softcap on and off, untied
weights, a tie at a row's maximum); on a GPU (`-m gpu`) also in bf16 against the three steps with
the one-program kernel, up to DiffusionGemma's shape (256 x 262,144 x 2,816).

Tolerances (kernels/canvas_vocab_pass.py's docstring): argmax exact; the sample exact wherever the
draw is not within 1e-5 of a step of the cumulative sum (float64 window), inside the window
where it is; entropy and confidence within fp32 re-association; soft within
2^-7 (p @ |E|) + 2^-8 |soft| in bf16 (each probability rounded once, relative to a different
reference) and 1e-5 (p @ |E|) in fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import ops
from dlmrt.ops import vocab

CAP = 30.0


def _inputs(rows: int, v: int, hidden: int, seed: int, dtype=torch.float32, tied=True):
    """h in k/8, weights in k/16 (|k| small): every product and partial sum of the logits is
    exact in fp32, so any summation order gives the same logits and the same rounding of them.
    Row 0 ties its maximum: a later copy of its best weight row, in another chunk."""
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def grid(lo: int, hi: int, shape, step: float) -> torch.Tensor:
        return (torch.randint(lo, hi, shape, device=DEV, generator=gen) * step).to(dtype)

    h = grid(-2, 3, (rows, hidden), 1 / 8)
    embed = grid(-8, 9, (vocab_rows := v, hidden), 1 / 16)
    head = embed if tied else grid(-8, 9, (vocab_rows, hidden), 1 / 16)
    best = int(F.linear(h[:1].float(), head.float()).argmax())
    later = min(v - 1, best + 130)  # past the 128-entry chunk
    if later != best:
        head = head.clone()
        head[later] = head[best]
    u = torch.rand(rows, device=DEV, generator=gen)
    u[-1] = 0.9999999  # the clamp at V - 1 in reach
    return h, head, embed, u


def _window(h, head, cap, t, u, tol: float = 1e-5):
    """Per row, the tokens a draw at u +- tol gives (float64 CDF of the head's logits in the
    model dtype): lo == hi where the draw is off a boundary."""
    z = vocab.softcapped(F.linear(h, head), cap).double() / t.double()
    cdf = torch.cumsum(torch.softmax(z, -1), -1)
    last = head.shape[0] - 1
    lo = torch.searchsorted(cdf, (u.double() - tol).clamp(min=0)[:, None], right=True)[:, 0]
    hi = torch.searchsorted(cdf, (u.double() + tol)[:, None], right=True)[:, 0]
    return lo.clamp(max=last), hi.clamp(max=last)


def _check(got, want, soft, soft_want, sc, embed, window, rows_exact: int) -> None:
    """`got` (kernel) against `want` (the three steps): see the module docstring."""
    assert torch.equal(got[0], want[0])
    lo, hi = window
    off = lo == hi
    assert torch.equal(got[2][off], want[2][off]) and torch.equal(got[2][off], lo[off])
    assert ((got[2] >= lo) & (got[2] <= hi)).all()
    assert off.sum() >= rows_exact  # the exact comparison is not vacuous
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[3], want[3], atol=1e-6, rtol=1e-4)
    assert soft.dtype == soft_want.dtype
    mass = sc.float() @ embed.float().abs()
    bf16 = soft.dtype != torch.float32
    bound = (2**-7 * mass + 2**-8 * soft_want.float().abs()) if bf16 else 1e-5 * mass
    assert ((soft.float() - soft_want.float()).abs() <= bound + 1e-6).all()


def _three_steps(h, head, embed, cap, t, u, kernel: bool):
    """The head, canvas_vocab (the twin, or with `kernel` the one-program kernel) and sc @ E."""
    raw = F.linear(h, head)
    sc = torch.empty(raw.shape, dtype=embed.dtype, device=raw.device)
    if kernel:
        from dlmrt._kernels import canvas_vocab

        argmax, entropy, sampled = canvas_vocab.canvas_vocab(raw, cap, t, u, sc)
    else:
        argmax, entropy, sampled = vocab.canvas_vocab(raw, cap, t, u, sc)
    conf = vocab.confidence(vocab.softcapped(raw, cap) / t, argmax, embed.dtype)
    return (argmax, entropy, sampled, conf), sc @ embed, sc


@pytest.mark.parametrize("cap", [None, CAP])
def test_twin_is_the_three_steps(cap):
    """Bit for bit the head, `canvas_vocab` and the GEMM; `ops` on the CPU runs the twin."""
    h, head, embed, u = _inputs(6, 300, 24, 0, tied=False)
    t = torch.tensor(0.7)
    want, soft_want, _ = _three_steps(h, head, embed, cap, t, u, kernel=False)
    for fn in (vocab.canvas_vocab_pass, ops.canvas_vocab_pass):
        soft = torch.empty(6, 24)
        got = fn(h, head, embed, cap, t, u, soft)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert torch.equal(soft, soft_want)


def test_bad_shapes_are_named():
    pytest.importorskip("triton")  # the kernel module's own checks (the CPU wheel has no Triton)
    from dlmrt._kernels import canvas_vocab_pass

    h, head, embed, u = _inputs(2, 40, 8, 0)
    t = torch.tensor(1.0)
    with pytest.raises(ValueError, match="weight"):
        canvas_vocab_pass.canvas_vocab_pass(h, head[:, :4], embed, None, t, u, torch.empty(2, 8))
    with pytest.raises(ValueError, match="soft must be"):
        canvas_vocab_pass.canvas_vocab_pass(h, head, embed, None, t, u, torch.empty(2, 9))


# (rows, vocab, hidden, cap, T, tied): vocabularies off the 128-entry chunk and the 32-entry
# group, a width off the 64-column steps, one / several row blocks, near-greedy T and T > 1
CASES = [
    (1, 37, 16, None, 1.0, True),
    (5, 300, 40, CAP, 0.8, True),
    (20, 1000, 72, 3.0, 0.5, False),
    (33, 129, 24, None, 2.0, True),
    (3, 700, 32, CAP, 0.05, True),
]


@kernel_test
@pytest.mark.parametrize("rows,v,hidden,cap,t,tied", CASES)
def test_kernel_matches_the_twin_fp32(rows, v, hidden, cap, t, tied):
    from dlmrt._kernels import canvas_vocab_pass

    h, head, embed, u = _inputs(rows, v, hidden, rows + v, tied=tied)
    t = torch.tensor(t, device=DEV)
    soft = torch.empty(rows, hidden, device=DEV)
    got = canvas_vocab_pass.canvas_vocab_pass(h, head, embed, cap, t, u, soft)
    want, soft_want, sc = _three_steps(h, head, embed, cap, t, u, kernel=False)
    window = _window(h, head, cap, t, u)
    _check(got, want, soft, soft_want, sc, embed, window, rows_exact=rows - 1)
    if rows > 1:  # row 0's maximum is tied: the first index
        z = vocab.softcapped(F.linear(h[:1], head), cap)
        assert int((z[0] == z[0].max()).sum()) >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize(
    "rows,v,hidden", [(1, 1000, 72), (7, 4099, 200), (32, 50_000, 512), (256, 262_144, 2816)]
)
def test_gpu_bf16_against_the_three_steps_with_the_row_kernel(rows, v, hidden):
    """bf16 (DiffusionGemma's shape last): the kernel against the head (cuBLAS), the
    one-program kernel and the GEMM, which round y = z in bf16 with the same softcap
    arithmetic, so only the probabilities' own rounding and the order of additions differ."""
    from dlmrt._kernels import canvas_vocab_pass

    h, head, embed, u = _inputs(rows, v, hidden, 1, dtype=torch.bfloat16)
    t = torch.tensor(0.8, device=DEV)
    soft = torch.empty(rows, hidden, dtype=torch.bfloat16, device=DEV)
    got = canvas_vocab_pass.canvas_vocab_pass(h, head, embed, CAP, t, u, soft)
    want, soft_want, sc = _three_steps(h, head, embed, CAP, t, u, kernel=True)
    window = _window(h, head, CAP, t, u)
    # at vocabularies of 50k+ a draw's window (u +- 1e-5) often spans tokens of probability
    # ~1e-5: seen on an H100, 23 of 32 and 202 of 256 rows off a boundary
    _check(got, want, soft, soft_want, sc, embed, window, rows_exact=max(1, rows // 2))
