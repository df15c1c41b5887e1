"""Procedural, verifiable training tasks, registered by name.

A task module provides `generate(seed) -> Problem` (fields `question`, `solution`, `answer`),
`iter_split(split, start_seed)`, `problems(split, count)` and `verify(text, answer) -> bool`.
"""

from __future__ import annotations

from types import ModuleType

from dlmrt.train.tasks import arithmetic, arithmetic_chain, sum_set

TASKS: dict[str, ModuleType] = {
    arithmetic.NAME: arithmetic,
    arithmetic_chain.NAME: arithmetic_chain,
    sum_set.NAME: sum_set,
}


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise ValueError(f"task: unknown task {name!r} (choose from {', '.join(TASKS)})")
    return TASKS[name]
