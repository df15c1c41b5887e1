"""ORL's tasks: the procedural ones (`dlmrt/train/tasks/`) and `math`, problems from a JSONL file.

`math` reads `--data FILE` in the formats `dlmrt bench` reads (GSM8K {"question", "answer"
ending "#### N"} or {"prompt", "answer"}: `dlmrt/bench/datasets.py`) and verifies with the bench's
math scorer (`dlmrt/bench/scorers.py: score_math`: math-verify when installed, else numeric).
Questions get the bench's math template (step by step, answer in \\boxed{}). Question texts in a
1/32 hash bucket (`arithmetic.is_test`) are held out for evaluation; the train split cycles.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from dlmrt.train.tasks import TASKS, arithmetic, get_task

MATH = "math"
NAMES = (*TASKS, MATH)


@dataclass(frozen=True, slots=True)
class FileProblem:
    seed: int  # row index (decides chat vs raw, as a procedural problem's seed does)
    question: str
    answer: str


class MathFile:
    """A task over a JSONL file of math problems (the interface of `dlmrt.train.tasks`)."""

    def __init__(self, path: str) -> None:
        from dlmrt.bench.datasets import TEMPLATES, load_problems

        rows = load_problems(path)
        if rows[0].kind != "math":
            raise ValueError(f"data: {path} holds code problems; the math task needs math rows")
        template = TEMPLATES[("math", True)]  # chat or raw alike: the question asks for \boxed{}
        self.rows = [
            FileProblem(i, template.replace("{prompt}", p.text), p.answer)
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
        from dlmrt.bench.scorers import score_math

        return score_math(text, answer)


@cache
def resolve_task(name: str, data: str | None = None):
    """The task object of `name` (`data`: the math task's JSONL file)."""
    if name == MATH:
        if data is None:
            raise ValueError("task: math needs --data FILE (a JSONL of math problems)")
        return MathFile(data)
    return get_task(name)
