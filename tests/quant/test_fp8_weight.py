"""The per-channel (`formats/fp8.py`) and per-tensor (`quant/per_tensor.py`) quantizers the
checkpoint formats use: scales, error bounds, zero rows."""

from __future__ import annotations

import pytest
import torch

from dlmrt.formats.fp8 import FP8, FP8_MAX, MIN_SCALE, quantize_per_channel
from dlmrt.quant.per_tensor import quantize_per_tensor


def _weights(*shape: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    # rows of very different magnitudes: one scale per row must follow each
    scales = torch.logspace(-3, 2, shape[-2], dtype=torch.float32)
    return torch.randn(*shape, generator=gen) * scales[:, None]


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 17)])
def test_per_channel_scale_is_row_amax_over_448(shape):
    w = _weights(*shape)
    q = quantize_per_channel(w)
    assert q.qweight.dtype == FP8 and q.qweight.shape == w.shape
    assert q.scale.dtype == torch.float32 and q.scale.shape == w.shape[:-1]
    torch.testing.assert_close(q.scale, w.abs().amax(-1) / FP8_MAX, rtol=0, atol=0)
    # the largest entry of every row lands on +-448 exactly
    assert torch.equal(q.qweight.float().abs().amax(-1), torch.full(w.shape[:-1], FP8_MAX))


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 17)])
def test_dequantize_error_is_within_half_an_e4m3_step(shape):
    """e4m3 has 3 mantissa bits: |w - deq| <= 2^-4 |w| for normal values, plus the subnormal
    spacing (2^-9 * scale) near zero."""
    w = _weights(*shape)
    q = quantize_per_channel(w)
    err = (q.dequantize(torch.float32) - w).abs()
    bound = w.abs() * 2**-4 + q.scale[..., None] * 2**-9
    assert bool((err <= bound).all())
    assert q.dequantize(torch.bfloat16).dtype == torch.bfloat16


def test_zero_rows_are_safe():
    w = _weights(4, 8)
    w[1] = 0
    q = quantize_per_channel(w)
    assert q.scale[1] == MIN_SCALE and bool((q.qweight[1].float() == 0).all())
    assert bool(torch.isfinite(q.dequantize(torch.float32)).all())
    zero = quantize_per_tensor(torch.zeros(3, 4))
    assert bool((zero.scale == MIN_SCALE).all()) and bool(
        (zero.dequantize(torch.float32) == 0).all()
    )


def test_per_tensor_scale_is_one_per_matrix_or_expert():
    w = _weights(3, 5, 17)
    q = quantize_per_tensor(w)
    assert q.scale.shape == (3, 5)
    expected = w.abs().flatten(1).amax(-1) / FP8_MAX
    assert torch.equal(q.scale, expected[:, None].expand(3, 5))
    # the per-tensor scale is coarser: small rows lose precision the per-channel one keeps
    per_row = quantize_per_channel(w)
    small = (per_row.dequantize(torch.float32) - w)[:, 0].abs().max()
    assert (q.dequantize(torch.float32) - w)[:, 0].abs().max() > small


def test_per_tensor_refuses_what_is_not_a_matrix():
    with pytest.raises(ValueError, match=r"quantize_per_tensor: expected a float \[N, K\]"):
        quantize_per_tensor(torch.ones(4))
    with pytest.raises(ValueError, match=r"quantize_per_tensor: expected a float"):
        quantize_per_tensor(torch.ones(4, 4, dtype=torch.int32))


def test_power_of_two_scaled_codes_requantize_exactly():
    """The premise of tests/quant/test_fp8_checkpoint_gpu.py: codes * 2^k (row max code 448),
    stored in bf16, quantize back to the same codes and scales."""
    q = quantize_per_channel(_weights(6, 40))
    scale = torch.exp2(torch.log2(q.scale).round())
    w = (q.qweight.float() * scale[:, None]).to(torch.bfloat16)
    again = quantize_per_channel(w)
    assert torch.equal(again.scale, scale)
    assert torch.equal(again.qweight.view(torch.uint8), q.qweight.view(torch.uint8))
