"""The account's table: one row per kernel, totals per op kind sorted by excess time, the total.

An op is one label's call (`dlmrt/account.py` record) with the kernels mapped to it; its name is
the label under its nearest enclosing module (`layers.3.self_attn.qk_norm_rope`), its kind the
name with the layer index starred (`layers.*.self_attn.qk_norm_rope`: summed over layers).
A kernel row carries its op's µs (all the op's kernels), floor and ratio.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from benchmarks.account import floors
from benchmarks.account.events import Kernel
from dlmrt.account import Record

UNLABELLED = "unlabelled"
_LAYER = re.compile(r"(^|\.)layers\.(\d+)(\.|$)")


@dataclass
class Op:
    name: str
    kind: str
    layer: int | None
    floor_us: float | None  # None: no floor (glue around nested ops, or unlabelled)
    kernels: list[Kernel] = field(default_factory=list)

    @property
    def us(self) -> float:
        return sum(k.us for k in self.kernels)


def op_name(records: list[Record], seq: int) -> str:
    """A record's display name: a module's path, or a label under the labels and the nearest
    module enclosing it (`layers.3.self_attn.qk_norm_rope`, `orl_inject.gate_up`)."""
    rec = records[seq]
    name = rec.name
    while rec.module is None and rec.parent is not None:
        rec = records[rec.parent]
        name = f"{rec.name}.{name}"
    return name.removeprefix("model.")


def kind_of(name: str) -> tuple[str, int | None]:
    """(the name with its layer index starred, the layer index or None)."""
    m = _LAYER.search(name)
    if m is None:
        return name, None
    return _LAYER.sub(r"\1layers.*\3", name, count=1), int(m.group(2))


def build_ops(
    records: list[Record], kernels: list[Kernel], seqs: list[int | None], bw: float, peak: float
) -> list[Op]:
    """The ops with kernels, in the order their first kernel ran (unlabelled kernels: one op)."""
    ops: dict[int | None, Op] = {}
    for k, seq in zip(kernels, seqs, strict=True):
        if seq not in ops:
            ops[seq] = _op(records, seq, bw, peak)
        ops[seq].kernels.append(k)
    return list(ops.values())


def _op(records: list[Record], seq: int | None, bw: float, peak: float) -> Op:
    if seq is None:
        return Op(UNLABELLED, UNLABELLED, None, None)
    name = op_name(records, seq)
    kind, layer = kind_of(name)
    cost = floors.cost(records[seq])
    return Op(name, kind, layer, None if cost is None else cost.floor_us(bw, peak))


def _ratio(us: float, floor: float | None) -> float | None:
    return round(us / floor, 2) if floor else None


def kernel_rows(ops: list[Op]) -> list[dict]:
    """One row per kernel in launch order: its name and µs, its op's name, kind, µs, floor."""
    rows = []
    for op in ops:
        for k in op.kernels:
            rows.append(
                {"start_us": k.start, "kernel": k.name, "us": round(k.us, 2), "op": op.name}
                | {"kind": op.kind, "layer": op.layer, "op_us": round(op.us, 2)}
                | {"floor_us": _round(op.floor_us), "ratio": _ratio(op.us, op.floor_us)}
            )
    rows.sort(key=lambda r: r["start_us"])
    for r in rows:
        del r["start_us"]
    return rows


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def kind_totals(ops: list[Op]) -> list[dict]:
    """Per kind (summed over layers): ops, kernels, µs, floor, excess = µs - floor (an op without
    a floor counts whole), ratio; sorted by excess, largest first."""
    acc: dict[str, dict] = defaultdict(lambda: dict(ops=0, kernels=0, us=0.0, floor_us=0.0))
    for op in ops:
        t = acc[op.kind]
        t["ops"] += 1
        t["kernels"] += len(op.kernels)
        t["us"] += op.us
        t["floor_us"] += op.floor_us or 0.0
    rows = []
    for kind, t in acc.items():
        floor = t["floor_us"]
        row = {"kind": kind, "ops": t["ops"], "kernels": t["kernels"], "us": round(t["us"], 2)}
        row |= {"floor_us": round(floor, 2), "excess_us": round(t["us"] - floor, 2)}
        rows.append(row | {"ratio": _ratio(t["us"], floor)})
    return sorted(rows, key=lambda r: -r["excess_us"])


def total(ops: list[Op]) -> dict:
    """The round: kernels, summed kernel µs, summed floors, wall span of its kernels (first start
    to last end: less than the sum where two streams overlap), the unlabelled share."""
    ks = [k for op in ops for k in op.kernels]
    us = sum(k.us for k in ks)
    floor = sum(op.floor_us or 0.0 for op in ops)
    lost = [k for op in ops if op.name == UNLABELLED for k in op.kernels]
    out = {"kernels": len(ks), "kernel_us": round(us, 2), "floor_us": round(floor, 2)}
    out["wall_us"] = round(max(k.end for k in ks) - min(k.start for k in ks), 2) if ks else 0.0
    out |= {"unlabelled_kernels": len(lost), "unlabelled_us": round(sum(k.us for k in lost), 2)}
    return out | {"ratio": _ratio(us, floor)}


def markdown(kinds: list[dict], rows: list[dict], tot: dict, width: int = 70) -> str:
    """The per-kind totals, the round's total, then every kernel (names cut to `width`)."""
    out = ["| kind | ops | kernels | µs | floor µs | excess µs | x floor |", "|---" * 7 + "|"]
    for r in kinds:
        out.append(
            f"| {r['kind']} | {r['ops']} | {r['kernels']} | {r['us']:.1f} | {r['floor_us']:.1f} "
            f"| {r['excess_us']:.1f} | {_fmt(r['ratio'])} |"
        )
    out.append(
        f"| **round** | | {tot['kernels']} | {tot['kernel_us']:.1f} | {tot['floor_us']:.1f} "
        f"| {tot['kernel_us'] - tot['floor_us']:.1f} | {_fmt(tot['ratio'])} |"
    )
    out += [
        "",
        f"wall span of the kernels: {tot['wall_us']:.1f} µs; unlabelled: "
        f"{tot['unlabelled_kernels']} kernels, {tot['unlabelled_us']:.1f} µs",
        "",
    ]
    out += ["| # | kernel | op | µs | op µs | op floor µs | x floor |", "|---" * 7 + "|"]
    for i, r in enumerate(rows):
        name = r["kernel"] if len(r["kernel"]) <= width else r["kernel"][: width - 1] + "…"
        name = name.replace("|", "\\|")  # a template argument must not split the row
        out.append(
            f"| {i} | `{name}` | {r['op']} | {r['us']:.1f} | {r['op_us']:.1f} "
            f"| {_fmt(r['floor_us'])} | {_fmt(r['ratio'])} |"
        )
    return "\n".join(out)


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"
