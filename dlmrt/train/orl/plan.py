"""From verified rollouts to replay documents and the loss weights (paper Appendix C).

A document is one response at one slicing step j (TraceRL): its prompt and clean tokens once,
then the j-th selected state of each of its blocks as noisy copies. Weights make every verified
response count the same: each supervised position of response R weighs 1 / N_R (N_R = its
selected states' valid positions), each AEC pair 1 / |P(R)| times its gate. The denominators
(responses with N_R > 0, and D = the sum of gated pair weights) are summed across ranks before
dividing, so neither packing nor data parallelism changes the objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dlmrt.train.orl.capture import Rollout, State
from dlmrt.train.orl.selection import aec_pairs, select_rounds


@dataclass
class Target:
    """What a selected state is trained toward besides CE: its AEC pair, if any."""

    aec_weight: float = 0.0  # w_R * g of the pair (b, k-1) -> (b, k); 0: no pair
    h_source: float = 0.0  # the source's captured mean normalised unresolved entropy


@dataclass
class Doc:
    rollout: Rollout
    states: list[State]  # the noisy copies, ascending block
    token_weight: float  # 1 / N_R
    targets: list[Target]  # one per state

    @property
    def clean_len(self) -> int:  # prompt blocks + clean blocks before the last noisy one
        return self.states[-1].block * self.states[-1].canvas.shape[0]

    @property
    def length(self) -> int:
        return self.clean_len + sum(s.canvas.shape[0] for s in self.states)


@dataclass
class Plan:
    docs: list[Doc] = field(default_factory=list)
    responses: float = 0.0  # denominator of L_pred: verified responses with N_R > 0
    aec_den: float = 0.0  # D
    states: int = 0
    pairs: int = 0


def valid_positions(rollout: Rollout, block: int, length: int) -> int:
    """|I_b|: response positions of block b up to the terminal stop token (it included)."""
    p, end = len(rollout.prompt_ids), len(rollout.prompt_ids) + len(rollout.token_ids)
    return max(0, min((block + 1) * length, end) - max(block * length, p))


def mean_unresolved_entropy(state: State, log_vocab: float) -> float:
    u = state.unresolved
    return float((state.entropy * u).sum() / u.sum()) / log_vocab


def plan(rollouts: list[Rollout], fraction: float, gate: float | None, vocab: int) -> Plan:
    """Documents and denominators of this rank's verified rollouts."""
    out, log_v = Plan(), math.log(vocab)
    for r in rollouts:
        if not r.verified:
            continue
        selected = {b: select_rounds(st, fraction) for b, st in r.blocks.items()}
        pairs = {b: aec_pairs(r.blocks[b], sel) for b, sel in selected.items()}
        n_r = sum(
            len(sel) * valid_positions(r, b, r.blocks[b][0].canvas.shape[0])
            for b, sel in selected.items()
        )
        if n_r == 0:
            continue
        out.responses += 1
        n_pairs = sum(len(p) for p in pairs.values())
        targets: dict[tuple[int, int], Target] = {}
        for b, sources in pairs.items():
            for k in sources:
                h = mean_unresolved_entropy(r.blocks[b][k], log_v)
                g = 1.0 if gate is None or h <= gate else 0.0
                targets[(b, k + 1)] = Target(g / n_pairs, h)
                out.aec_den += g / n_pairs
        out.pairs += n_pairs
        for j in range(max(len(sel) for sel in selected.values())):
            states = [r.blocks[b][sel[j]] for b, sel in sorted(selected.items()) if len(sel) > j]
            tg = [targets.get((s.block, s.round), Target()) for s in states]
            out.docs.append(Doc(r, states, 1.0 / n_r, tg))
            out.states += len(states)
    return out


def pack_docs(docs: list[Doc], max_tokens: int) -> list[list[Doc]]:
    """Rows of documents, first-fit by decreasing length (a document longer than `max_tokens`
    gets a row of its own). Deterministic: ties keep the documents' order."""
    rows: list[list[Doc]] = []
    sizes: list[int] = []
    for doc in sorted(docs, key=lambda d: -d.length):
        for i, size in enumerate(sizes):
            if size + doc.length <= max_tokens:
                rows[i].append(doc)
                sizes[i] += doc.length
                break
        else:
            rows.append([doc])
            sizes.append(doc.length)
    return rows
