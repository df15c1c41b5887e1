"""The one-pass vocabulary op: the twin (`dlmrt/ops/one_pass.py`) is today's head, statistics
and residual softmax op for op (CPU); the kernel (kernels/vocab_pass.py) against the twin, fp32
under TRITON_INTERPRET=1 on the CPU and fp32 / bf16 on a GPU (`-m gpu`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_env import CUDA, DEV, INTERPRET, kernel_test

from dlmrt import ops
from dlmrt.decoding import propose
from dlmrt.models.residual import soft_embedding
from dlmrt.ops import one_pass as twin

CHUNK = 128  # kernels/vocab_pass.py's BLOCK_V


def _ties(vocab: int) -> list[int]:
    return sorted({max(0, vocab // 2 - CHUNK), vocab // 2, vocab - 1})


def _inputs(rows: int, vocab: int, hidden: int, seed: int, dtype=torch.float32, tied=True):
    """Inputs on a coarse grid (h in k/8, weights in k/16, |k| small): every product and partial
    sum of the logits is exact in fp32, so any summation order (cuBLAS, tl.dot, the interpreter)
    gives the same logits and the same bf16 rounding of them; what is left to compare is the
    statistics' and z's own arithmetic."""
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def grid(lo: int, hi: int, shape, step: float) -> torch.Tensor:
        return (torch.randint(lo, hi, shape, device=DEV, generator=gen) * step).to(dtype)

    h = grid(-2, 3, (rows, hidden), 1 / 8)
    embed = grid(-8, 9, (vocab, hidden), 1 / 16)
    head = embed if tied else grid(-8, 9, (vocab, hidden), 1 / 16)
    if rows > 1:  # a tie at row 1's maximum (h . w at its largest): the first index wins; the
        # copies sit a chunk apart (in one split at vocab 3000 under the interpreter: the
        # running argmax) and in another split (the combine)
        head = head.clone()
        head[_ties(vocab)] = grid(0, 2, (hidden,), 1.0) - 0.5  # every entry +-8/16
        h[1] = head[vocab // 2] / 2
    return h, head, embed


@pytest.mark.parametrize("temperature,z_temperature", [(0.0, 1.0), (0.0, 0.5), (0.7, 0.7)])
def test_twin_is_todays_round_code(temperature, z_temperature):
    """Bit for bit the head, `propose` (greedy: its statistics) and `soft_embedding`."""
    h, head, embed = _inputs(7, 300, 32, 0, tied=False)
    got = twin.vocab_pass(h, head, embed, temperature, z_temperature)
    logits = F.linear(h, head)
    prop = propose(logits, temperature, torch.full((7,), 0.5))
    same = twin.same_temperature(temperature, z_temperature)
    z = soft_embedding(logits, embed, z_temperature, prop.log_z if same else None)
    if temperature <= 0:
        assert torch.equal(got[0], prop.tokens) and torch.equal(got[1], prop.confidence)
    assert torch.equal(got[2], prop.entropy) and torch.equal(got[3], prop.log_z)
    assert torch.equal(got[4], z)
    assert twin.vocab_pass(h, head, None, temperature, z_temperature)[4] is None


def test_op_on_cpu_runs_the_twin():
    h, head, embed = _inputs(3, 50, 16, 1)
    got = ops.vocab_pass(h, head, embed, 0.0, 1.0)
    want = twin.vocab_pass(h, head, embed, 0.0, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def _check(got, want) -> None:
    assert torch.equal(got[0], want[0])  # greedy tokens: identical, ties to the first index
    scale = 1.0 + want[3].abs().max().item()
    for a, b in zip(got[1:4:2], want[1:4:2]):  # confidence, log_z
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6 * scale)
    # entropy = log_z - E[x]: the difference of two numbers of a row's |log_z|, E[x] summed over
    # the vocabulary in another order (chunks, splits); on an H100 at hidden 2560 the tie row's
    # log_z is 321 (641 at temperature 0.5) and its entropy moved by 1e-5 (2.1e-5) of that
    err = (got[2] - want[2]).abs()
    assert (err <= 1e-4 * want[2].abs() + 5e-5 * (1.0 + want[3].abs())).all(), err.max()
    if want[4] is None:
        assert got[4] is None
        return
    assert got[4].dtype == want[4].dtype
    # z: the kernel rounds exp(x - running max) to E's dtype, the twin exp(x - log_z); bf16:
    # 2^-8 relative per probability, averaged over the vocabulary
    rtol = 1e-4 if want[4].dtype == torch.float32 else 2e-2
    atol = rtol * want[4].abs().max().item()
    torch.testing.assert_close(got[4].float(), want[4].float(), rtol=rtol, atol=atol)


SHAPES = [(1, 300, 64), (7, 1000, 96), (32, 517, 64), (7, 37, 96), (7, 3000, 96)]
if CUDA:
    SHAPES += [(r, 151936 if r >= 256 else 32000, 2560) for r in (1, 7, 32, 256, 512)]


@kernel_test
@pytest.mark.parametrize("rows,vocab,hidden", SHAPES)
@pytest.mark.parametrize("temperature,z_temperature", [(0.0, 1.0), (0.0, 0.7), (0.5, 0.5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_twin(rows, vocab, hidden, temperature, z_temperature, dtype):
    if not CUDA and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter's bf16 casts truncate")
    if INTERPRET and temperature > 0 and rows != 7:
        pytest.skip("slow under the interpreter: one shape for the sampled-temperature stats")
    from dlmrt._kernels.vocab_pass import BLOCK_V, vocab_pass

    assert BLOCK_V == CHUNK
    h, head, embed = _inputs(rows, vocab, hidden, rows + vocab, dtype)
    want = twin.vocab_pass(h, head, embed, temperature, z_temperature)
    assert rows == 1 or want[0][1] == _ties(vocab)[0]  # the tie is there
    _check(vocab_pass(h, head, embed, temperature, z_temperature), want)


@kernel_test
@pytest.mark.parametrize("rows,vocab,hidden", [(7, 300, 64), (32, 1000, 96)])
def test_kernel_untied_head_and_no_residual(rows, vocab, hidden):
    """LLaDA2's untied head (two tensors streamed side by side), and a Base model (no z)."""
    from dlmrt._kernels.vocab_pass import vocab_pass

    h, head, embed = _inputs(rows, vocab, hidden, 3, tied=False)
    _check(vocab_pass(h, head, embed, 0.0, 1.0), twin.vocab_pass(h, head, embed, 0.0, 1.0))
    _check(vocab_pass(h, head, None, 0.0, 1.0), twin.vocab_pass(h, head, None, 0.0, 1.0))
