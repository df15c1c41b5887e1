"""Arithmetic chains: the arithmetic task's problems with 3-8 operations instead of 1-4.

Why a second task (issue 17): on `arithmetic` the demo model is saturated on both axes (97.7%
accuracy; TPF 10.5 of at most 16: answers of ~40 tokens fill two or three blocks). Longer chains
give a Base model headroom on both: a solution of 3-8 equations (~50-140 tokens) spans several
blocks of 32, every equation's operand is the previous result, so a denoiser that commits only
what it is sure of needs several rounds per block, and every extra operation is one more chance
to slip. Same framings, operands, value range, verifier and hash split as `arithmetic.py`; only
the operation count differs, so a question never repeats across the two tasks' test splits by
construction of its seed stream, and the held-out split is again the 1/32 hash bucket.
"""

from __future__ import annotations

from collections.abc import Iterator

from dlmrt.tasks import arithmetic
from dlmrt.tasks.arithmetic import Problem, extract_answer, is_test, verify

NAME = "arithmetic_chain"
OPS = (3, 8)
MAX_RESPONSE_CHARS = 480  # 8 equations of at most 4-digit values and the answer sentence
ANSWER_PREFIX = arithmetic.ANSWER_PREFIX

__all__ = [
    "NAME",
    "OPS",
    "Problem",
    "extract_answer",
    "generate",
    "is_test",
    "iter_split",
    "problems",
    "verify",
]


def generate(seed: int) -> Problem:
    """The problem of `seed`: `arithmetic.generate` with 3-8 operations."""
    return arithmetic.generate(seed, OPS)


def iter_split(split: str, start_seed: int = 0) -> Iterator[Problem]:
    return arithmetic.iter_split(split, start_seed, OPS)


def problems(split: str, count: int) -> list[Problem]:
    return arithmetic.problems(split, count, OPS)
