"""The routed experts' rows in DeepGEMM's two M-grouped layouts (its README, "Grouped GEMMs"), built
from a routing's index [rows, top_k] in torch (CPU or GPU, no host sync but the layouts' sizes).

- masked (`m_grouped_*_gemm_nt_masked`): A [E, capacity, K], expert e's pairs in its first
  masked_m[e] rows (int32 [E]); the kernel computes only those. `capacity` covers any routing
  (a row meets an expert at most once: rows), rounded up to a whole 256-row M block so no block
  of one expert reaches into the next (tests/generators.py uses 4096 for the same reason).
- contiguous (`m_grouped_*_gemm_nt_contiguous`, index layout): A [M, K], each expert with pairs
  one segment of align(count, alignment) rows (alignment: DeepGEMM's
  get_mk_alignment_for_contiguous_layout(), its M block); grouped_layout int32 [M] gives each
  row's expert, -1 on a segment's padding rows, as tests/generators.py
  `generate_m_grouped_contiguous` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_M_MAX = 256  # DeepGEMM's largest SM90 M block


@dataclass(frozen=True)
class Routed:
    """A routing's (row, slot) pairs sorted by expert (stable: row order within an expert)."""

    expert: torch.Tensor  # [P] each sorted pair's expert
    rank: torch.Tensor  # [P] its place among its expert's pairs
    row: torch.Tensor  # [P] the activation row it reads
    counts: torch.Tensor  # [E] int32 pairs per expert


def uniform_index(
    rows: int, experts: int, top_k: int, touched: int | None, gen: torch.Generator
) -> torch.Tensor:
    """[rows, top_k] distinct experts per row, uniform over the first `touched` experts (all by
    default): random routing, as the benchmarks' random routers give."""
    touched = touched or experts
    if not top_k <= touched <= experts:
        raise ValueError(f"touched={touched}: expected top_k ({top_k}) <= touched <= {experts}")
    scores = torch.rand(rows, touched, generator=gen, device=gen.device)
    return scores.topk(top_k, dim=-1).indices


def route(index: torch.Tensor, experts: int) -> Routed:
    """`index` [rows, top_k] (expert ids) sorted by expert."""
    flat = index.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    starts = torch.cumsum(counts, 0) - counts
    expert = flat[order]
    rank = torch.arange(flat.numel(), device=flat.device) - starts[expert]
    return Routed(expert, rank, order // index.shape[1], counts.to(torch.int32))


def capacity(rows: int) -> int:
    """Masked rows per expert: every row (the most one expert can get), in whole 256-row blocks."""
    return -(-rows // BLOCK_M_MAX) * BLOCK_M_MAX


def masked(x: torch.Tensor, r: Routed, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [E, cap, K] with expert e's pairs' rows of x first, zeros after; masked_m int32 [E])."""
    if int(r.counts.max()) > cap:
        raise ValueError(f"capacity {cap} < {int(r.counts.max())} pairs of one expert")
    a = torch.zeros(r.counts.numel(), cap, x.shape[-1], dtype=x.dtype, device=x.device)
    a[r.expert, r.rank] = x[r.row]
    return a, r.counts


def contiguous(
    x: torch.Tensor, r: Routed, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A [M, K], grouped_layout int32 [M]: expert or -1, each pair's row in A [P])."""
    seg = (
        (r.counts.long() + alignment - 1) // alignment * alignment
    )  # 0 for an expert without pairs
    starts = torch.cumsum(seg, 0) - seg
    m = int(seg.sum())
    pos = starts[r.expert] + r.rank
    a = torch.zeros(m, x.shape[-1], dtype=x.dtype, device=x.device)
    a[pos] = x[r.row]
    layout = torch.full((m,), -1, dtype=torch.int32, device=x.device)
    layout[pos] = r.expert.to(torch.int32)
    return a, layout, pos
