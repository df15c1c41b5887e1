"""NVFP4 weights: E2M1 codes packed two per byte, one FP8 (e4m3) scale per 16 along K, a global scale.

A weight w [N, K] (or stacked experts [E, N, K]) is stored as
- `packed` uint8 [..., N, K/2]: code of element 2j in the low nibble, element 2j+1 in the high one;
  a code is sign (bit 3) | E2M1 magnitude index (bits 0-2) into `E2M1_VALUES`;
- `block_scale` e4m3 [..., N, K/16]: one scale per 16 consecutive elements of a row;
- `global_scale` fp32 [] (dense) or [E] (per expert): w ≈ e2m1(code) * block_scale * global_scale;
  or one per output row [..., N] (`cat_rows`: projections sharing one GEMM keep their own scales);
- `input_scale` fp32 [] or None: the checkpoint's static activation global scale (ModelOpt's
  `input_scale` = amax / (6 * 448); one per layer, the largest expert's for stacked experts, as
  one quantizer serves all experts of a layer); only `activations="nvfp4"` emulation reads it.
This is ModelOpt's layout (`weight`, `weight_scale`, `weight_scale_2`); compressed-tensors stores the
reciprocal global scale (`weight_global_scale`), the reader inverts it (`nvfp4_reader.py`).
`quantize_nvfp4` picks the scales as ModelOpt does: global = amax / (6 * 448), block = amax16 / 6
(`dlmrt/quant/nvfp4_scales.py` searches better block scales). Pure torch: runs on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmrt.formats.fp8 import FP8, FP8_MAX

BLOCK = 16  # elements per block scale
E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of codes 0..7
# Midpoints between neighbouring magnitudes; a value exactly on one rounds to the even code.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
MIN_GLOBAL = 1e-12  # an all-zero tensor gets this global scale (its codes are all zero)


def e2m1_table(device: torch.device | None = None) -> torch.Tensor:
    """fp32 [16]: the value of each 4-bit code (8..15 are the negatives of 0..7)."""
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """The 4-bit code (uint8 0..15) nearest to each value of x (saturating at ±6; ties to even)."""
    a = x.float().abs().clamp(max=E2M1_MAX)
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=x.device)
    idx = torch.searchsorted(mids, a.contiguous())  # ties land on the lower magnitude ...
    tie_up = (idx % 2 == 1) & (a == mids[idx.clamp(max=len(_MIDPOINTS) - 1)])
    idx = idx + tie_up.to(idx.dtype)  # ... unless the upper one has the even code
    sign = (x < 0) & (idx > 0)  # no negative zero: -0.1 -> code 0
    return (idx + 8 * sign.to(idx.dtype)).to(torch.uint8)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] (K even) -> uint8 [..., K/2], element 2j in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1: the last dim must be even, got {list(codes.shape)}")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> uint8 codes [..., K] (the inverse of `pack_e2m1`)."""
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)


@dataclass(frozen=True, eq=False)
class Nvfp4Weight:
    """packed uint8 [..., N, K/2]; block_scale e4m3 [..., N, K/16]; global_scale fp32 [] / [E]
    (per tensor / expert) or [..., N] (per output row: `per_row`); input_scale fp32 [] or None."""

    packed: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor
    input_scale: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.packed.shape[:-1], 2 * self.packed.shape[-1]))

    @property
    def nbytes(self) -> int:
        """What a GEMM reads: 4.5 bits per weight, plus the global scales."""
        t = (self.packed, self.block_scale, self.global_scale)
        return sum(x.numel() * x.element_size() for x in t)

    @property
    def per_row(self) -> bool:
        """Whether global_scale has one value per output row ([..., N]) rather than per tensor."""
        return self.global_scale.shape == self.packed.shape[:-1]

    def scales(self) -> torch.Tensor:
        """fp32 [..., N, K/16]: block_scale * global_scale, the multiplier of each block's codes."""
        g = self.global_scale.float()
        g = g.unsqueeze(-1) if self.per_row else g.reshape(*g.shape, 1, 1)
        return self.block_scale.float() * g

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        values = e2m1_table(self.packed.device)[unpack_e2m1(self.packed).long()]
        blocks = values.unflatten(-1, (-1, BLOCK)) * self.scales().unsqueeze(-1)
        return blocks.flatten(-2).to(dtype)

    def narrow(self, start: int, rows: int) -> Nvfp4Weight:
        """Output channels [start, start + rows) (the last but one dim): a view."""
        dim = self.packed.dim() - 2
        g = self.global_scale.narrow(dim, start, rows) if self.per_row else self.global_scale
        return Nvfp4Weight(
            self.packed.narrow(dim, start, rows),
            self.block_scale.narrow(dim, start, rows),
            g,
            self.input_scale,
        )

    def to(self, device: torch.device) -> Nvfp4Weight:
        moved = (t.to(device) for t in (self.packed, self.block_scale, self.global_scale))
        scale = None if self.input_scale is None else self.input_scale.to(device)
        return Nvfp4Weight(*moved, scale)


def cat_rows(weights: list[Nvfp4Weight]) -> Nvfp4Weight:
    """Dense weights [N_i, K] stacked along N into one [sum N_i, K] with a per-row global scale
    [sum N_i] (each part keeps its own, so it dequantizes to the concatenation of the parts'
    dequantized weights, bit for bit): gate|up as one GEMM. Its input scale is the largest of the
    parts' (they share one input, one quantizer, as `ops.nvfp4.act_quantizers`), None if any has
    none."""
    if any(w.packed.dim() != 2 for w in weights):
        raise ValueError("cat_rows: expected dense [N, K] weights")
    rows = [w.global_scale.float().reshape(-1).expand(w.packed.shape[0]) for w in weights]
    scales = [w.input_scale for w in weights]
    inp = None
    if all(s is not None for s in scales):
        inp = torch.stack([s.float().reshape(()) for s in scales]).amax()
    return Nvfp4Weight(
        torch.cat([w.packed for w in weights]),
        torch.cat([w.block_scale for w in weights]),
        torch.cat(rows),
        inp,
    )


def check_k(w: torch.Tensor, what: str = "quantize_nvfp4") -> None:
    if w.dim() not in (2, 3) or not w.is_floating_point() or w.shape[-1] % BLOCK:
        raise ValueError(
            f"{what}: expected a float [N, K] or [E, N, K] with K a multiple of {BLOCK}, got "
            f"{w.dtype} {list(w.shape)}"
        )


def global_scale_of(w: torch.Tensor) -> torch.Tensor:
    """fp32 [] ([E] for a stacked [E, N, K]): amax / (6 * 448), so every block scale fits e4m3."""
    amax = w.detach().float().abs().flatten(-2).amax(dim=-1)
    return (amax / (E2M1_MAX * FP8_MAX)).clamp_min(MIN_GLOBAL)


def encode(w: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor) -> Nvfp4Weight:
    """w [..., N, K] with the given per-block multipliers (fp32 [..., N, K/16], before rounding
    to e4m3) and global scales: round the block scales to e4m3, then the values to E2M1 codes."""
    g = global_scale.float().reshape(*global_scale.shape, 1, 1)
    bs = (block_scale / g).clamp(0, FP8_MAX).to(FP8)
    step = (bs.float() * g).unsqueeze(-1)  # the real multiplier of each block
    blocks = w.detach().float().unflatten(-1, (-1, BLOCK))
    scaled = torch.where(step > 0, blocks / step.clamp_min(1e-30), torch.zeros_like(blocks))
    return Nvfp4Weight(pack_e2m1(round_e2m1(scaled.flatten(-2))), bs, global_scale.float())


def quantize_nvfp4(w: torch.Tensor) -> Nvfp4Weight:
    """w [N, K] / [E, N, K] (K % 16 == 0) to NVFP4 with amax scales (ModelOpt's default)."""
    check_k(w)
    amax16 = w.detach().float().abs().unflatten(-1, (-1, BLOCK)).amax(dim=-1)
    return encode(w, amax16 / E2M1_MAX, global_scale_of(w))
