"""E2M1 (NVFP4) codes to MMA operands by bit placement: no table, no per-code select.

An E2M1 code is sign bit 3 | exponent bits 2..1 | mantissa bit 0, value 2^(e-1) * (1 + m/2) (and
m/2 for e = 0: 0 or 0.5). Put its three magnitude bits at the bottom of a wider float's exponent
field with the mantissa bit on top of the mantissa, and the wider float holds code * 2^-(bias-1)
exactly, the e = 0 case landing on that float's subnormal 0.5 * 2^-(bias-1) as it must:
- fp16 (bias 15): bits 11..9, value code * 2^-14 (`fp16_codes`);
- bf16 (bias 127): bits 8..6, value code * 2^-126 (`bf16_pairs_asm`, two codes per 32-bit word).

`expert_halves` decodes one packed byte tile [BN, BK/2] into its two nibble halves, the low
nibbles (even k) and the high ones (odd k), each [BN, BK/2], so each half meets a stride-2
activation tile in its own dot and nothing is interleaved back into K order (an interleave is a
register shuffle per element). Both halves come out as code * block scale * 2^-7, exact in bf16
(a 2-bit by a 4-bit significand) and fp32: the per-expert global scale times 2^7 is left to the
accumulator. On the GPU with bf16 activations the placement and the block-scale multiply are
inline PTX on packed words (a `prmt` spreads two bytes into a word, four bit operations place two
codes, one `mul.rn.bf16x2` scales them: about 3 instructions per weight); elsewhere (fp32, the CPU
interpreter, which cannot run inline PTX) the same values come from plain Triton operations through
`fp16_codes`. The bf16 product of the subnormal code * 2^-126 and the scale * 2^119 is normal
(>= 2^-17), so nothing depends on subnormal outputs.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Two bytes of the packed word $2 spread into the low bytes of two 16-bit lanes (prmt selectors
# 0x4140 / 0x4342, the zero register as bytes 4..7), then per lane: magnitude to bits 8..6, sign to
# bit 15, and one bf16x2 multiply by the lane's scale ($3 / $4).
_PLACE = {
    False: ("shl.b32 m0, t0, 6;", "shl.b32 s0, t0, 12;", "shl.b32 m1, t1, 6;", "shl.b32 s1, t1, 12;"),
    True: ("shl.b32 m0, t0, 2;", "shl.b32 s0, t0, 8;", "shl.b32 m1, t1, 2;", "shl.b32 s1, t1, 8;"),
}  # fmt: skip


def _asm(high: bool) -> str:
    m0, s0, m1, s1 = _PLACE[high]
    return f"""{{
.reg .b32 z, t0, t1, m0, s0, m1, s1;
mov.b32 z, 0;
prmt.b32 t0, $2, z, 0x4140;
prmt.b32 t1, $2, z, 0x4342;
{m0} {s0}
and.b32 m0, m0, 0x01C001C0; and.b32 s0, s0, 0x80008000; or.b32 m0, m0, s0;
{m1} {s1}
and.b32 m1, m1, 0x01C001C0; and.b32 s1, s1, 0x80008000; or.b32 m1, m1, s1;
mul.rn.bf16x2 $0, m0, $3;
mul.rn.bf16x2 $1, m1, $4;
}}"""


LOW_ASM: tl.constexpr = tl.constexpr(_asm(False))
HIGH_ASM: tl.constexpr = tl.constexpr(_asm(True))


@triton.jit
def fp16_codes(c):
    """fp32 code * 2^-14 from int32 codes c (sign bit 3, magnitude bits 2..0)."""
    w = ((c & 7) << 9) | ((c & 8) << 12)
    return w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _spread(s, BN: tl.constexpr, G: tl.constexpr):
    """[BN, G] per-group values -> [BN, 8 G] (each group's 16 weights are 8 bytes of a half)."""
    return tl.reshape(tl.broadcast_to(s[:, :, None], (BN, G, 8)), (BN, G * 8))


@triton.jit
def expert_halves(b, s, dtype: tl.constexpr, ASM: tl.constexpr):
    """(low, high) [BN, BK/2] in `dtype`: code * block scale * 2^-7 of the low / high nibbles of
    the bytes b [BN, BK/2] (uint8), with s [BN, BK/16] the block scales (e4m3 or fp32)."""
    BN: tl.constexpr = b.shape[0]
    G: tl.constexpr = s.shape[1]
    if ASM:  # bf16: code * 2^-126 times scale * 2^119 (exact in fp32, then in bf16)
        m = _spread((s.to(tl.float32) * 6.646139978924579e35).to(tl.bfloat16), BN, G)
        low = tl.inline_asm_elementwise(
            LOW_ASM, "=r,=r,r,r,r", [b, m], dtype=tl.bfloat16, is_pure=True, pack=4
        )
        high = tl.inline_asm_elementwise(
            HIGH_ASM, "=r,=r,r,r,r", [b, m], dtype=tl.bfloat16, is_pure=True, pack=4
        )
    else:  # code * 2^-14 times scale * 2^7
        m = _spread(s.to(tl.float32) * 128.0, BN, G)
        c = b.to(tl.int32)
        low = (fp16_codes(c) * m).to(dtype)
        high = (fp16_codes(c >> 4) * m).to(dtype)
    return low, high
