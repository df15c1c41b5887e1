"""Fp8Weight and the per-channel / per-tensor quantizers: the twin math every FP8 kernel is checked
against (dequantize, then the bf16 op)."""

from __future__ import annotations

import pytest
import torch

from dlmrt.quant import FP8_DTYPE, FP8_MAX, Fp8Weight, quantize_per_channel, quantize_per_tensor


def _weights(*shape: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    # rows of very different magnitudes: one scale per row must follow each
    scales = torch.logspace(-3, 2, shape[-2], dtype=torch.float32)
    return torch.randn(*shape, generator=gen) * scales[:, None]


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 17)])
def test_per_channel_scale_is_row_amax_over_448(shape):
    w = _weights(*shape)
    q = quantize_per_channel(w)
    assert q.qweight.dtype == FP8_DTYPE and q.qweight.shape == w.shape
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
    assert q.scale[1] == 1.0 and bool((q.qweight[1].float() == 0).all())
    assert bool(torch.isfinite(q.dequantize(torch.float32)).all())
    assert bool((quantize_per_tensor(torch.zeros(3, 4)).scale == 1.0).all())


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


def test_bad_inputs_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"quantize_per_channel: expected a float \[N, K\]"):
        quantize_per_channel(torch.ones(4))
    with pytest.raises(ValueError, match="qweight: expected torch.float8_e4m3fn"):
        Fp8Weight(torch.ones(2, 2), torch.ones(2))
    with pytest.raises(ValueError, match=r"scale: expected float32 \[2\]"):
        Fp8Weight(torch.ones(2, 2).to(FP8_DTYPE), torch.ones(2, 1))
