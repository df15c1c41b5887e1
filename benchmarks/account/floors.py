"""The floor of one labelled op: its FLOPs and HBM bytes from the shapes it ran on.

floor µs = max(FLOPs / peak, bytes / copy bandwidth) (`benchmarks/common.py`'s device-following
PEAK_BYTES; PEAK_FLOPS bf16, twice that where the op's weights are FP8). Bytes are what the op must
move at least once: its weights (a routed-experts op: only the experts its routing touched), the
activations it reads and the ones it writes; each tensor counted once however often it is named.

By record (`dlmrt/account.py`):
- a module's range with no range inside it: its parameters and buffers, its inputs and outputs;
  FLOPs 2 x rows x weight elements where it holds linear weights; `nn.Embedding` reads only the
  rows it gathers; `Experts`: see `_experts`.
- a label, by name: GEMMs over (x, weight) (`GEMMS`), attention over the visible keys, the
  vocabulary pass, norms + RoPE (read and write the same bytes), the activation (reads 2I, writes
  I); any other label: the bytes it reads and `writes`.
- a range with ranges inside it: no floor for its own kernels (glue around the nested ops).
Every floor is a lower bound: an output a label does not name counts as not written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from dlmrt.account import Record

GEMMS = ("qkv", "gate_up", "orl_z", "sc_embed")  # labels whose reads are (x, weight [N, K])
ROW_OPS = ("qk_norm_rope", "q_norm_rope", "kv_norm_rope")  # read and write the same bytes


@dataclass(frozen=True)
class Cost:
    flops: float = 0.0
    nbytes: float = 0.0
    fp8: bool = False  # FLOPs at the FP8 peak (FP8 weights)

    def floor_us(self, bandwidth: float, peak_flops: float) -> float:
        peak = peak_flops * (2 if self.fp8 else 1)
        return max(self.flops / peak, self.nbytes / bandwidth) * 1e6


def tensors(obj: object) -> list[torch.Tensor]:
    """The tensors in obj: a tensor, a module's parameters and buffers, the fields of a
    NamedTuple or dataclass (quantized weights and activations), a tuple or list of these."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, nn.Module):
        return [*obj.parameters(), *obj.buffers()]
    if hasattr(obj, "_fields"):
        obj = tuple(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))
    if isinstance(obj, tuple | list):
        return [t for item in obj for t in tensors(item)]
    return []


def nbytes(*objs: object) -> int:
    """Bytes of the distinct tensors in objs (a tied weight named twice counts once)."""
    seen, total = set(), 0
    for t in (t for o in objs for t in tensors(o)):
        key = (t.device, t.data_ptr(), t.nbytes)
        if t.device.type != "meta" and key not in seen:
            seen.add(key)
            total += t.nbytes
    return total


def rows(obj: object) -> int:
    """Rows of an activation (all dims but the last), through a quantized activation's fields."""
    ts = tensors(obj)
    return ts[0].shape[:-1].numel() if ts and ts[0].dim() > 0 else 0


def _fp8(*objs: object) -> bool:
    return any(t.element_size() == 1 and t.is_floating_point() for o in objs for t in tensors(o))


def _linear_elems(m: nn.Module) -> int:
    """Weight elements of the linear layers in m (in x out features), 0 for none."""
    total = 0
    for sub in m.modules():
        if isinstance(sub, nn.Embedding):
            continue
        if hasattr(sub, "in_features") and hasattr(sub, "out_features"):
            total += sub.in_features * sub.out_features
        elif isinstance(getattr(sub, "qweight", None), torch.Tensor):
            total += sub.qweight.numel()
    return total


def _module(rec: Record) -> Cost:
    m = rec.module
    if type(m).__name__ == "Experts":
        return _experts(rec)
    if isinstance(m, nn.Embedding):  # reads the gathered rows only
        return Cost(0, nbytes(*rec.reads) + 2 * nbytes(*rec.writes))
    x = rec.reads[0] if rec.reads else None
    flops = 2 * rows(x) * _linear_elems(m)
    return Cost(flops, nbytes(m, *rec.reads, *rec.writes), _fp8(m))


def _experts(rec: Record) -> Cost:
    """Routed experts: the touched experts' weights (distinct ids in the routing `index`), x and
    the output; FLOPs 2 x (rows x top-k) x 3 H I."""
    m, (x, _weights, index) = rec.module, rec.reads[:3]
    impl = getattr(m, "impl", None)
    stacks = nbytes(m, getattr(impl, "scales", None), getattr(impl, "stacks", None))
    experts = m.down_proj.shape[0]
    touched = int(torch.unique(index).numel())
    moved = stacks * touched / experts + nbytes(x, *rec.writes)
    fp8 = _fp8(m) or type(impl).__name__ == "W8A8Experts"
    return Cost(2 * index.numel() * 3 * m.down_proj[0].numel(), moved, fp8)


def _gemm(x, w) -> Cost:
    """x [rows, K] times a weight of K x N elements (either layout: [N, K] for F.linear, [K, N]
    for p @ E); the output [rows, N] in the model dtype (2 bytes)."""
    n, k = rows(x), tensors(x)[0].shape[-1]
    return Cost(2 * n * w.numel(), nbytes(x, w) + n * (w.numel() // k) * 2, _fp8(w))


def _attention(q, k, v, positions, window: int = 0) -> Cost:
    """q [heads, rows, d] over the keys visible from `positions` (block-causal: up to the
    last position; a sliding window: at most window - 1 context keys before the rows)."""
    heads, n, d = q.shape
    keys = int(positions.max()) + 1
    if window:
        keys = min(keys, window - 1 + n)
    per_key = sum(t.nbytes // t.shape[-2] for t in {id(t): t for t in (k, v)}.values())
    return Cost(4 * heads * n * keys * d, 2 * q.nbytes + keys * per_key)


def _vocab_pass(h, weight, embed) -> Cost:
    passes = 1 if embed is None else 2  # logits = h W^T, then z = p E
    return Cost(2 * rows(h) * weight.numel() * passes, nbytes(h, weight, embed), _fp8(weight))


def cost(rec: Record) -> Cost | None:
    """The floor's FLOPs and bytes of a record's own kernels (None: a range with ranges inside)."""
    if rec.children:
        return None
    if rec.module is not None:
        return _module(rec)
    if rec.name in GEMMS:
        return _gemm(*rec.reads[:2])
    if rec.name == "attention":
        return _attention(*rec.reads)
    if rec.name in ("vocab_pass", "canvas_vocab_pass"):  # (h, head weight, embedding)
        return _vocab_pass(*rec.reads[:3])
    if rec.name == "gate_up_act":  # the fused GLU: the GEMM, writing act(gate) * up [rows, N/2]
        x, w = rec.reads[:2]
        gemm, n_out = _gemm(x, w), w.numel() // tensors(x)[0].shape[-1]
        return Cost(gemm.flops, gemm.nbytes - rows(x) * n_out, gemm.fp8)  # half of N, 2 bytes
    scale = 2.0 if rec.name in ROW_OPS else 1.5 if rec.name == "act_mul" else 1.0
    return Cost(0, scale * nbytes(*rec.reads) + nbytes(*rec.writes))
