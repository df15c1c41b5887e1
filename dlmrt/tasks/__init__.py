"""Procedural, verifiable training tasks, registered by name.

A task (a module, or an object such as `sum_set.SumSet`) provides `generate(seed) -> Problem`
(fields `question`, `solution`, `answer`), `iter_split(split, start_seed)`,
`problems(split, count)` and `verify(text, answer) -> bool`.
"""

from __future__ import annotations

from typing import Any

from dlmrt.tasks import arithmetic, arithmetic_chain
from dlmrt.tasks.sum_set import SUM_SET, SUM_SET_SMALL

TASKS: dict[str, Any] = {
    arithmetic.NAME: arithmetic,
    arithmetic_chain.NAME: arithmetic_chain,
    SUM_SET.name: SUM_SET,
    SUM_SET_SMALL.name: SUM_SET_SMALL,
}


def get_task(name: str) -> Any:
    if name not in TASKS:
        raise ValueError(f"task: unknown task {name!r} (choose from {', '.join(TASKS)})")
    return TASKS[name]
