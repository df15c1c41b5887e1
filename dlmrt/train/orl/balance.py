"""Cost-balanced assignment of replay documents to data-parallel ranks (paper Appendix D.3).

Every rank plans its own verified rollouts (selection, documents, weights), then the documents
(only their selected states, moved to the CPU: nothing unselected travels) are gathered on every
rank and assigned largest-cost-first to the least-loaded rank (ties: the lower rank), so every
rank computes the same assignment. The cost is a document's rows (clean context + noisy copies).
The loss denominators are summed across ranks separately (`step.py`), so the assignment changes
only which rank computes a term, never the objective.
"""

from __future__ import annotations

import dataclasses

import torch.distributed as torch_dist

from dlmrt.train.orl.capture import State
from dlmrt.train.orl.plan import Doc


def _portable(doc: Doc) -> Doc:
    """The document with its rollout's other states dropped and its tensors on the CPU."""
    r = dataclasses.replace(doc.rollout, states=[], blocks={})
    states = [
        State(
            s.block,
            s.round,
            s.canvas.cpu(),
            s.unresolved.cpu(),
            None if s.z is None else s.z.cpu(),
            s.entropy.cpu(),
            s.accepted.cpu(),
        )
        for s in doc.states
    ]
    return Doc(r, states, doc.token_weight, doc.targets)


def assign(docs: list[Doc], world: int) -> list[list[Doc]]:
    """Largest cost first, each to the least-loaded rank (deterministic)."""
    loads, parts = [0] * world, [[] for _ in range(world)]
    order = sorted(range(len(docs)), key=lambda i: (-docs[i].length, i))
    for i in order:
        rank = min(range(world), key=lambda k: (loads[k], k))
        parts[rank].append(docs[i])
        loads[rank] += docs[i].length
    return parts


def share(docs: list[Doc], rank: int, world: int) -> list[Doc]:
    """This rank's documents out of every rank's `docs`."""
    if world == 1:
        return docs
    gathered: list = [None] * world
    torch_dist.all_gather_object(gathered, [_portable(d) for d in docs])
    everything = [d for part in gathered for d in part]
    # prompt order (a prompt's rollouts all sit on one rank, in rollout order): the same list as
    # one process would plan
    everything.sort(key=lambda d: d.rollout.prompt_index)
    return assign(everything, world)[rank]
