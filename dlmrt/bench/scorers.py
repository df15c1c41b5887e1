"""Scorers: is a completion's final numeric answer equal to the gold answer?

With the optional `math-verify` package (the `bench` extra) answers are parsed and compared
symbolically; without it a simple numeric scorer compares the last \\boxed{...}, "#### x" or
number in the completion with the gold number (a note is logged once).
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction
from functools import cache
from typing import Any

log = logging.getLogger("dlmrt")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
BOXED = re.compile(r"\\boxed\s*\{")


def gold_answer(answer: str) -> str:
    """GSM8K: the text after the last "####" (commas removed); other answers as written."""
    if "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    return answer.strip().replace(",", "")


def score_math(completion: str, gold: str) -> bool:
    """True if the completion's final answer equals the gold answer (GSM8K "####" handled)."""
    gold = gold_answer(gold)
    mv = _math_verify()
    if mv is not None:
        # math-verify's timeouts use SIGALRM, which only the main thread may set.
        main = threading.current_thread() is threading.main_thread()
        timeout = {"parsing_timeout": 5} if main else {"parsing_timeout": None}
        parsed_gold = mv.parse(gold, **timeout)
        parsed = mv.parse(completion, **timeout)
        return bool(mv.verify(parsed_gold, parsed, timeout_seconds=5 if main else None))
    return numeric_equal(extract_answer(completion), gold)


def scorer_name() -> str:
    return "math-verify" if _math_verify() is not None else "numeric"


@cache
def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        log.warning(
            "math-verify is not installed: numeric answers are compared by a simple numeric "
            "scorer (pip install 'dlmrt[bench]' for math-verify)"
        )
        return None
    return math_verify


def extract_answer(text: str) -> str | None:
    """The last \\boxed{...} content, else the text after the last "####", else the last number."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _last_boxed(text: str) -> str | None:
    matches = list(BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None  # unbalanced: the answer was cut off


def numeric_equal(predicted: str | None, gold: str) -> bool:
    """Compare as exact rationals: "1,234" == "1234" == "1234.0"; "$72" == "72"."""
    a, b = _number(predicted), _number(gold)
    return a is not None and b is not None and a == b


def _number(text: str | None) -> Fraction | None:
    if text is None:
        return None
    found = NUMBER.findall(text.replace("$", ""))
    if not found:
        return None
    try:
        return Fraction(found[-1].replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
