"""Shard a BUILT model over a tensor-parallel group, in place (gpt-fast style).

The models stay single-device code: this module slices their parameters and fixes the few
attributes that hold head counts, so the same forward runs on 1/world of the heads, MLP rows and
expert rows, with one all-reduce after each row-parallel part:

    attention     q/k/v column-parallel by heads, o row-parallel (+ all-reduce). GQA with fewer KV
                  heads than ranks: each rank keeps the one KV head its query heads read
                  (replicated); world % kv_heads must then be 0
    gated MLPs    gate/up column, down row (+ all-reduce): dense MLPs, the ORL adapter,
                  DiffusionGemma's dense branch and self-conditioning MLP, LLaDA2's shared expert
    routed MoE    TP by each expert's intermediate dim (router replicated): LLaDA2's routed and
                  shared experts are summed before one all-reduce per MoE block; DiffusionGemma's
                  experts all-reduce before their post-norm (see docs/tensor-parallel.md: why TP
                  and not EP)
    vocabulary    vocab-parallel embedding and LM head; the rules' statistics, the draws, z and
                  DiffusionGemma's soft embedding combined in `vocab.py`

Modules are recognised by their shape, never by their family: an attention module has `heads`,
`kv_heads`, `head_dim` and either q_proj / k_proj / v_proj / o_proj with a `qkv` slot (`unfuse`)
or one `query_key_value` and `dense`; gated MLPs are `layers.SwiGLU`, routed experts
`models/experts.py`'s `Experts`. `model.cfg` becomes the rank's local config through the config's
own `with_local_heads` (head counts), so the engines size their KV arenas per rank. A dimension
that does not divide raises `ShardError` naming it.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.models import layers, moe
from dlmrt.models.experts import Experts
from dlmrt.parallel.group import TPGroup
from dlmrt.parallel.linear import (
    ShardError,
    VocabParallelEmbedding,
    all_reduce_output,
    column,
    heads_slice,
    keep_rows,
    row,
    split,
)


def local_heads(heads: int, kv_heads: int, group: TPGroup) -> tuple[int, int, int, int]:
    """(first q head, q heads, first kv head, kv heads) of this rank."""
    hl = split(heads, group.world, "num_attention_heads")
    if kv_heads >= group.world:
        kvl = split(kv_heads, group.world, "num_key_value_heads")
        return group.rank * hl, hl, group.rank * kvl, kvl
    if group.world % kv_heads:
        raise ShardError(
            f"tensor parallel: num_key_value_heads = {kv_heads} is fewer than the world size "
            f"{group.world} and does not divide it (KV heads are replicated)"
        )
    return group.rank * hl, hl, group.rank * hl // (heads // kv_heads), 1


def _attention(m: nn.Module, group: TPGroup, q, k, v, o) -> None:
    """Slice the q/k/v projections (None: not present) and o by this rank's heads."""
    q0, hl, k0, kvl = local_heads(m.heads, m.kv_heads, group)
    d = m.head_dim
    column(q, heads_slice(d, q0, hl))
    for lin in (k, v):
        if lin is not None:
            column(lin, heads_slice(d, k0, kvl))
    row(o, heads_slice(d, q0, hl))
    all_reduce_output(o, group)
    m.heads, m.kv_heads = hl, kvl


def _projections_attention(m: nn.Module, group: TPGroup) -> None:
    """Attention with q_proj / k_proj / v_proj (None: K = V) / o_proj and a `qkv` slot that
    stacks them (QwenDLM, DiffusionGemma): unfused, sliced, re-fused after loading."""
    m.unfuse()
    _attention(m, group, m.q_proj, m.k_proj, m.v_proj, m.o_proj)


def _fused_qkv_attention(m: nn.Module, group: TPGroup) -> None:
    """The fused query_key_value rows are [q heads | k heads | v heads]: slice each part."""
    d, heads, kv = m.head_dim, m.heads, m.kv_heads
    q0, hl, k0, kvl = local_heads(heads, kv, group)
    ar = lambda start, n: torch.arange(start * d, (start + n) * d)  # noqa: E731
    index = torch.cat((ar(q0, hl), ar(heads + k0, kvl), ar(heads + kv + k0, kvl)))
    column(m.query_key_value, index)
    row(m.dense, heads_slice(d, q0, hl))
    all_reduce_output(m.dense, group)
    m.heads, m.kv_heads = hl, kvl


def _mlp(m: layers.SwiGLU, group: TPGroup, name: str, reduce: bool) -> None:
    n = split(m.gate_proj.out_features, group.world, f"intermediate size of {name}")
    rows = slice(group.rank * n, (group.rank + 1) * n)
    m.unfuse()
    column(m.gate_proj, rows)
    column(m.up_proj, rows)
    row(m.down_proj, rows)
    if reduce:
        all_reduce_output(m.down_proj, group)


def _experts(m: Experts, group: TPGroup, name: str) -> None:
    """Keep this rank's slice of every expert's intermediate dim (a fused gate_up_proj
    [E, 2I, H] holds gate rows first, then up rows: this rank's of both)."""
    inter = m.down_proj.shape[2]
    n = split(inter, group.world, f"moe_intermediate_size ({name})")
    r = group.rank
    rows = slice(r * n, (r + 1) * n)
    if m.fused_gate_up:
        index = torch.cat(
            (torch.arange(r * n, (r + 1) * n), torch.arange(inter + r * n, inter + (r + 1) * n))
        )
        m.gate_up_proj = keep_rows(m.gate_up_proj, index, 1)
    else:
        m.gate_proj = keep_rows(m.gate_proj, rows, 1)
        m.up_proj = keep_rows(m.up_proj, rows, 1)
    m.down_proj = keep_rows(m.down_proj, rows, 2)


def _vocab_parallel(model: nn.Module, embed_name: str, group: TPGroup) -> None:
    """Embedding and LM head keep this rank's vocabulary rows (tied heads stay tied)."""
    full = getattr(model.model, embed_name)
    tied = model.lm_head.weight is full.weight
    emb = VocabParallelEmbedding(full, group)
    setattr(model.model, embed_name, emb)
    if tied:
        model.lm_head.weight = emb.weight
    else:
        column(model.lm_head, slice(emb.offset, emb.offset + emb.num_embeddings))
    model.lm_head.out_features = emb.num_embeddings


def _local_config(model: nn.Module, attention: list[nn.Module]) -> None:
    """The rank's config (`with_local_heads`: each family's config says what it sizes by)."""
    kv = tuple(m.kv_heads for m in attention)
    model.cfg = model.cfg.with_local_heads(attention[0].heads, kv)


def shard_model(model: nn.Module, group: TPGroup, fuse: bool = True) -> nn.Module:
    """Shard `model` (QwenDLM, LLaDA2 or DiffusionGemma, loaded) over `group`, in place.
    A group of one rank runs the whole distributed code path on full-size slices (tests). On
    the meta device (before loading, `loading.py`) it only reshapes; fuse=False then."""
    moes = [m for m in model.modules() if isinstance(m, moe.SparseMoE)]
    shared = {id(m.shared_experts) for m in moes}
    summed = {id(m.experts) for m in moes}  # reduced with the shared experts' sum, once
    attention = []  # by its shape, not its family: the layers' attention modules, in order
    for name, m in list(model.named_modules()):
        if hasattr(m, "query_key_value") and hasattr(m, "kv_heads"):
            _fused_qkv_attention(m, group)
            attention.append(m)
        elif hasattr(m, "q_proj") and hasattr(m, "kv_heads"):
            _projections_attention(m, group)  # re-fused from the sliced projections below
            attention.append(m)
        elif isinstance(m, layers.SwiGLU):
            _mlp(m, group, name, reduce=id(m) not in shared)
        elif isinstance(m, Experts):
            _experts(m, group, name)
            if id(m) not in summed:  # DiffusionGemma: reduced before its post-norm
                all_reduce_output(m, group)
        elif isinstance(m, moe.SparseMoE):
            all_reduce_output(m, group)  # routed + shared partial sums: one all-reduce
    _vocab_parallel(model, getattr(model, "EMBED", "embed_tokens"), group)
    _local_config(model, attention)
    if fuse and hasattr(model, "fuse_projections"):  # the loader fuses after sliced loading
        model.fuse_projections()
    return model
