"""The one-pass arena attention kernel (kernels/arena_attention.py) vs `reference.arena_attention`:
its unmasked interior (keys every row of a tile sees) and masked tail, both.

Device machine: `pytest -m gpu tests/ops/test_arena_attention_gpu.py` (also
tests/ops/test_kernels_gpu.py). Without CUDA, TRITON_INTERPRET=1 runs the fp32 cases on CPU
tensors (the interpreter's loop form, the same two loops).
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, kernel_test
from test_arena_split_gpu import SHAPES, TOL, _case

from dlmrt.ops import reference

pytestmark = [pytest.mark.gpu, kernel_test]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "start,rows,block",
    [
        (0, 7, 8),  # a round shorter than a tile: its keys are one partial tile (masked only)
        (96, 32, 32),  # a round: every key tile unmasked
        (200, 40, 8),  # a tile over five blocks: unmasked up to its first row's end, then masked
        (0, 100, 16),  # prefill from 0: the first tile sees [0, 16) .. [0, 64)
        (130, 64, 64),  # rows not at a block start (a round's pass of a partly written block)
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_pass_matches_twin(shape, start, rows, block, dtype):
    if dtype == torch.bfloat16 and not CUDA:
        pytest.skip("the Triton interpreter's bf16 tl.dot is wrong")
    from dlmrt._kernels.arena_attention import arena_attention

    q, k, v, pos, end = _case(*shape, start, rows, block, dtype, seed=start + rows)
    scale = shape[2] ** -0.5
    out = arena_attention(q, k, v, pos, block, scale, splits=1)
    ref = reference.arena_attention(
        q.float(), k[:, :end].float(), v[:, :end].float(), pos, block, scale
    )
    assert not out.isnan().any()  # keys past the last visible row hold NaN
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
