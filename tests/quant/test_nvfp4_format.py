"""NVFP4 format (dlmrt/formats/nvfp4.py): E2M1 codes, nibble packing, dequantization, amax scales."""

from __future__ import annotations

import pytest
import torch

from dlmrt.formats.nvfp4 import (
    E2M1_VALUES,
    Nvfp4Weight,
    e2m1_table,
    pack_e2m1,
    quantize_nvfp4,
    round_e2m1,
    unpack_e2m1,
)

FP8 = torch.float8_e4m3fn


def test_pack_unpack_is_exact_for_every_pair_of_codes():
    lo, hi = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    codes = torch.stack([lo.flatten(), hi.flatten()], dim=-1).flatten().to(torch.uint8)  # 512
    packed = pack_e2m1(codes)
    assert packed.shape == (256,) and packed.dtype == torch.uint8
    assert sorted(packed.tolist()) == list(range(256))  # every byte value once
    # element 2j is the low nibble: byte = lo | hi << 4
    assert torch.equal(packed.int(), (lo.flatten() | (hi.flatten() << 4)).int())
    assert torch.equal(unpack_e2m1(packed), codes)
    with pytest.raises(ValueError, match="last dim must be even"):
        pack_e2m1(codes[:3])


def test_every_code_rounds_back_to_itself_and_ties_go_to_even():
    table = e2m1_table()
    assert table.tolist()[:8] == list(E2M1_VALUES) and table.tolist()[8:] == [
        -v for v in E2M1_VALUES
    ]
    codes = round_e2m1(table)
    assert codes[:8].tolist() == list(range(8))
    assert codes[8:].tolist() == [0] + list(range(9, 16))  # -0.0 is code 0, not 8
    # halfway values go to the even code: 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2, 2.5->2, 3.5->4, 5->4
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0, 100.0])
    assert table[round_e2m1(ties).long()].tolist() == [0, 1, 1, 2, 2, 4, 4, -4, 6, 6]
    assert table[round_e2m1(torch.tensor([0.26, 2.51, -0.24])).long()].tolist() == [0.5, 3, 0]


def test_dequantize_matches_hand_computed_values():
    # one row of 32: codes 0..15 twice; block scales 2 and 0.5; global scale 0.25
    codes = torch.arange(32) % 16
    w = Nvfp4Weight(
        pack_e2m1(codes.to(torch.uint8)).reshape(1, 16),
        torch.tensor([[2.0, 0.5]]).to(FP8),
        torch.tensor(0.25),
    )
    got = w.dequantize(torch.float32)[0]
    vals = list(E2M1_VALUES) + [-v for v in E2M1_VALUES]
    assert got[:16].tolist() == [v * 2 * 0.25 for v in vals]
    assert got[16:].tolist() == [v * 0.5 * 0.25 for v in vals]
    assert w.shape == (1, 32) and w.nbytes == 16 + 2 + 4


def test_quantize_amax_scales_and_error_bound():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 24, 64, generator=gen) * torch.rand(3, 1, 1, generator=gen) * 5
    q = quantize_nvfp4(w)
    assert q.packed.shape == (3, 24, 32) and q.block_scale.shape == (3, 24, 4)
    assert q.global_scale.shape == (3,) and q.block_scale.dtype == FP8
    amax = w.abs().flatten(1).amax(1)
    torch.testing.assert_close(q.global_scale, amax / (6 * 448))
    deq = q.dequantize(torch.float32)
    blocks = (deq - w).abs().unflatten(-1, (4, 16))
    step = q.scales().unsqueeze(-1)  # the multiplier of each block: half of E2M1's largest gap (2)
    assert (blocks <= step * 1.0 + 1e-6).all()
    # each block's largest value lands on ±6 steps (within e4m3 rounding of its scale)
    top = w.abs().unflatten(-1, (4, 16)).amax(-1) / q.scales()
    assert ((top > 6 / 1.07) & (top < 6 * 1.07)).all()
    assert quantize_nvfp4(torch.zeros(4, 32)).dequantize(torch.float32).eq(0).all()
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.randn(4, 24))


def test_fake_quant_act_is_nvfp4_quantize_dequantize_per_16():
    from dlmrt.ops.nvfp4 import fake_quant_act

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 48, generator=gen)
    scale = x.abs().amax() / (6 * 448)
    y = fake_quant_act(x, scale)
    assert y.shape == x.shape and y.dtype == x.dtype
    again = fake_quant_act(y, scale)  # what is on the grid stays there
    torch.testing.assert_close(again, y, rtol=1e-6, atol=0)
    blocks = (y - x).abs().unflatten(-1, (3, 16))
    step = x.abs().unflatten(-1, (3, 16)).amax(-1, keepdim=True) / 6
    assert (blocks <= step * 1.07 + 1e-6).all()  # within one E2M1 gap (2 steps) / 2 at the top
    assert not torch.equal(y, x)
