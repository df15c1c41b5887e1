"""Which captured states a verified rollout trains on, and its AEC pairs (paper Appendix E).

Per block: the ceil(fraction * n) states that accept the most new tokens (ties: the earlier
round) plus the block's final state. AEC pairs (b, k) -> (b, k + 1): the next state is selected
and both unresolved sets are nonempty; the source need not be selected (its captured entropy is
the reference).
"""

from __future__ import annotations

import math

from dlmrt.train.orl.capture import State


def select_rounds(states: list[State], fraction: float) -> list[int]:
    """Selected round indices (ascending) of one block's states (rounds 0 .. n-1 in order)."""
    n = len(states)
    if n == 0:
        return []
    top = math.ceil(fraction * n)
    ranked = sorted(range(n), key=lambda k: (-states[k].num_accepted, k))
    return sorted(set(ranked[:top]) | {n - 1})


def aec_pairs(states: list[State], selected: list[int]) -> list[int]:
    """Source rounds k of the block's valid pairs (k, k + 1)."""
    chosen = set(selected)
    return [
        k
        for k in range(len(states) - 1)
        if k + 1 in chosen
        and bool(states[k].unresolved.any())
        and bool(states[k + 1].unresolved.any())
    ]
