"""Group a MoE layer's (row, slot) pairs by expert on the device without a sort: one program
(a few pairs) or one per 64-pair chunk.

Decode passes route at most a few thousand pairs (32 rows x 8 for LLaDA-2.1-mini, 256 x 8 for
DiffusionGemma); `torch.sort` + `searchsorted` + the cumsums cost ~8 launches and a 64-bit radix
sort (~26 us on the H200) per layer. One program instead walks the pairs in chunks twice:
(1) per-expert counts (one-hot sums), giving starts (exclusive cumsum) and tile ends (cumsum of
ceil(count / BM)); (2) each pair's slot = start[e] + pairs of e in earlier chunks + pairs of e
earlier in this chunk, so one expert's pairs keep pair order (the same `order` as the stable sort
of `moe_mlp.plan`). Passes of more than one chunk (LLaDA's 256 pairs, DiffusionGemma's 2,048,
prefill) take `plan_chunked` (the same two walks spread over one program per chunk, three
launches: measured faster in the round, below), the largest the torch sort plan.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .device import shared_memory

CHUNK = 64
# Up to one chunk of pairs (rounds of <= 8 rows at top-8): the single program; above, the chunked
# plan. On the H200 the single program groups 256 pairs in 14-18 us and 2,048 in 88 us (sort
# path ~40 / 63 us); LLaDA-2.1-mini's 32-row round (256 pairs a layer) took 4.019 / 4.025 ms with
# the chunked plan against 4.138 / 4.139 with the single program (two runs each, alternated:
# benchmarks/results/round_latency_llada2_bf16_plan_h200_2026-12-02.json), although alone, as a
# replayed graph of plans, the two measured 19.5 vs 17.9 us: in the round the chunked plan wins.
MAX_PAIRS = CHUNK


@triton.jit
def _plan_kernel(
    index_ptr,
    order_ptr,
    tile_end_ptr,
    counts_ptr,
    starts_ptr,
    P,  # runtime (masks): prefill and commit passes vary it
    P_PAD: tl.constexpr,  # loop bound: P rounded up to 256 (at most 4 compiled variants)
    E: tl.constexpr,
    E_PAD: tl.constexpr,
    CH: tl.constexpr,
    BM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    ids = tl.arange(0, E_PAD)
    lane = tl.arange(0, CH)
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for c0 in range(0, P_PAD, CH):
        p = c0 + lane
        e = tl.load(index_ptr + p, mask=p < P, other=E_PAD).to(tl.int32)  # padding: no expert
        counts += tl.sum((e[:, None] == ids[None, :]).to(tl.int32), axis=0)
    ends = tl.cumsum(counts, 0)
    starts = ends - counts
    tile_end = tl.cumsum((counts + BM - 1) // BM, 0)
    tl.store(counts_ptr + ids, counts, mask=ids < E)
    tl.store(starts_ptr + ids, starts, mask=ids < E)
    tl.store(tile_end_ptr + ids, tile_end, mask=ids < E)
    seen = starts  # per expert: the next free slot
    earlier = lane[None, :] < lane[:, None]  # [CH, CH]: column pair precedes row pair
    for c0 in range(0, P_PAD, CH):
        p = c0 + lane
        ok = p < P
        e = tl.load(index_ptr + p, mask=ok, other=E_PAD).to(tl.int32)  # padding: no expert
        onehot = e[:, None] == ids[None, :]  # [CH, E_PAD]
        base = tl.sum(tl.where(onehot, seen[None, :], 0), axis=1)
        e_col = tl.load(index_ptr + p, mask=ok, other=-1).to(tl.int32)  # padding matches none
        before = tl.sum((earlier & (e[:, None] == e_col[None, :])).to(tl.int32), axis=1)
        tl.store(order_ptr + base + before, p.to(order_ptr.dtype.element_ty), mask=ok)
        seen += tl.sum(onehot.to(tl.int32), axis=0)


def plan_small(index: torch.Tensor, experts: int, block_m: int):
    """Same outputs as `moe_mlp.plan` (one launch; `moe_mlp.plan` takes it up to MAX_PAIRS, it
    serves any count up to MAX_CHUNKED_PAIRS, slower as they grow)."""
    pairs = index.numel()
    dev = index.device
    order = torch.empty(pairs, dtype=torch.int64, device=dev)
    tile_end, counts, starts = (torch.empty(experts, dtype=torch.int32, device=dev) for _ in "abc")
    _plan_kernel[(1,)](
        index.reshape(-1), order, tile_end, counts, starts,
        P=pairs, P_PAD=-(-pairs // 256) * 256, E=experts, E_PAD=triton.next_power_of_2(experts), CH=CHUNK, BM=block_m,
        **pdl.launch(),
    )  # fmt: skip
    return order, tile_end, counts, starts


# Above MAX_PAIRS, up to MAX_CHUNKED_PAIRS (DiffusionGemma's 2,048-pair canvas, short prefills):
# the same grouping over many programs, three launches: per-chunk counts; one program for the
# exclusive cumsums over chunks and over experts; per-chunk slots. Above: the torch sort.
MAX_CHUNKED_PAIRS = 16384  # 256 chunks x E: the middle program's tile stays small
# The scan program holds chunks x experts int32 (both padded to powers of two) in shared memory,
# 4 bytes an entry: 65,536 (256 chunks x LLaDA2's 256 experts, a 2,048-row prefill) asked an H100
# for 256 KiB, over its 227 KiB.


def chunked_fits(pairs: int, experts: int, device: torch.device) -> bool:
    """Whether `plan_chunked` takes `pairs` pairs over `experts` experts on `device` (its shared
    memory per block; the CPU: Hopper's); else the torch sort."""
    tile = triton.next_power_of_2(triton.cdiv(pairs, CHUNK)) * triton.next_power_of_2(experts)
    return MAX_PAIRS < pairs <= MAX_CHUNKED_PAIRS and 4 * tile <= shared_memory(device)


@triton.jit
def _chunk_counts_kernel(
    index_ptr, chunk_counts_ptr, P, E: tl.constexpr, E_PAD: tl.constexpr, CH: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program c: per-expert pair counts of chunk c -> chunk_counts[c, :E]."""
    pdl.enter(PDL)
    c = tl.program_id(0)
    ids = tl.arange(0, E_PAD)
    p = c * CH + tl.arange(0, CH)
    e = tl.load(index_ptr + p, mask=p < P, other=E_PAD).to(tl.int32)  # padding: no expert
    counts = tl.sum((e[:, None] == ids[None, :]).to(tl.int32), axis=0)
    tl.store(chunk_counts_ptr + c * E + ids, counts, mask=ids < E)


@triton.jit
def _chunk_scan_kernel(chunk_counts_ptr, tile_end_ptr, counts_ptr, starts_ptr, NC,
                       NC_PAD: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
                       BM: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """One program: chunk_counts[c, e] -> starts[e] + pairs of e in chunks before c (in place)."""
    pdl.enter(PDL)
    ch = tl.arange(0, NC_PAD)
    ids = tl.arange(0, E_PAD)
    ok = (ch[:, None] < NC) & (ids[None, :] < E)
    at = chunk_counts_ptr + ch[:, None] * E + ids[None, :]
    cc = tl.load(at, mask=ok, other=0)
    counts = tl.sum(cc, axis=0)
    starts = tl.cumsum(counts, 0) - counts
    tile_end = tl.cumsum((counts + BM - 1) // BM, 0)
    tl.store(counts_ptr + ids, counts, mask=ids < E)
    tl.store(starts_ptr + ids, starts, mask=ids < E)
    tl.store(tile_end_ptr + ids, tile_end, mask=ids < E)
    tl.store(at, starts[None, :] + tl.cumsum(cc, 0) - cc, mask=ok)


@triton.jit
def _chunk_slots_kernel(
    index_ptr, chunk_base_ptr, order_ptr, P, E: tl.constexpr, E_PAD: tl.constexpr, CH: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program c: each pair's slot = its expert's base for chunk c + pairs of it earlier in c."""
    pdl.enter(PDL)
    c = tl.program_id(0)
    lane = tl.arange(0, CH)
    ids = tl.arange(0, E_PAD)
    p = c * CH + lane
    ok = p < P
    e = tl.load(index_ptr + p, mask=ok, other=E_PAD).to(tl.int32)
    seen = tl.load(chunk_base_ptr + c * E + ids, mask=ids < E, other=0)
    base = tl.sum(tl.where(e[:, None] == ids[None, :], seen[None, :], 0), axis=1)
    e_col = tl.load(index_ptr + p, mask=ok, other=-1).to(tl.int32)  # padding matches none
    earlier = lane[None, :] < lane[:, None]
    before = tl.sum((earlier & (e[:, None] == e_col[None, :])).to(tl.int32), axis=1)
    tl.store(order_ptr + base + before, p.to(order_ptr.dtype.element_ty), mask=ok)


def plan_chunked(index: torch.Tensor, experts: int, block_m: int):
    """Same outputs as `moe_mlp.plan` where `chunked_fits(index.numel(), experts, device)`."""
    pairs, dev = index.numel(), index.device
    flat = index.reshape(-1)
    chunks = triton.cdiv(pairs, CHUNK)
    e_pad = triton.next_power_of_2(experts)
    order = torch.empty(pairs, dtype=torch.int64, device=dev)
    tile_end, counts, starts = (torch.empty(experts, dtype=torch.int32, device=dev) for _ in "abc")
    chunk_counts = torch.empty((chunks, experts), dtype=torch.int32, device=dev)
    _chunk_counts_kernel[(chunks,)](
        flat, chunk_counts, pairs, E=experts, E_PAD=e_pad, CH=CHUNK, **pdl.launch()
    )
    _chunk_scan_kernel[(1,)](
        chunk_counts, tile_end, counts, starts, chunks,
        NC_PAD=triton.next_power_of_2(chunks), E=experts, E_PAD=e_pad, BM=block_m, **pdl.launch(),
    )  # fmt: skip
    _chunk_slots_kernel[(chunks,)](
        flat, chunk_counts, order, pairs, E=experts, E_PAD=e_pad, CH=CHUNK, **pdl.launch()
    )
    return order, tile_end, counts, starts
