"""Arithmetic word problems: procedural, verifiable, deterministic from a seed.

A problem is a start value and 1-4 operations (+, -, *, /) stated in one of four framings:

  story       "Tom has 23 apples. He buys 15 more and gives away 9. How many apples now?"
  shop        "A shop has 120 pens. It sells 35. Then it receives 40 more. How many ..."
  steps       "Start with 48. Add 7. Divide by 5. What is the result?"
  expression  "What is (12 + 30) * 2?"  (also compact: "12+30")

Operands have 1-3 digits (the number of digits is uniform in {1, 2, 3}); multipliers and
divisors are 2-9 and divisions are exact; every intermediate value stays in [1, 9999]. The
number of operations is uniform in {1, 2, 3, 4}. The solution is one equation per operation,
left to right, then the answer sentence:

  "23 + 15 = 38. 38 - 9 = 29. The answer is 29."

So a solver must read which operations the text asks for, copy the operands, and do
multi-digit addition/subtraction with carries, 4-digit by 1-digit multiplication and exact
division by 2-9. `verify` extracts the number after the last "The answer is".

Splits are by seed: train problems come from seeds 0, 1, 2, ..., test problems from seeds
10**9, 10**9 + 1, ...; a problem belongs to the test split iff a hash of its question text
falls in a 1/32 bucket, and each split keeps only its own bucket, so no train question is
ever a test question (the same text can come from two seeds, mostly for 1-operation problems).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

NAME = "arithmetic"
TEST_SEED_OFFSET = 10**9
TEST_BUCKETS = 32  # 1 / TEST_BUCKETS of all question texts are reserved for the test split
MAX_VALUE = 9999
ANSWER_PREFIX = "The answer is"
MAX_RESPONSE_CHARS = 200  # the longest solution text (4 operations) is well below this
OPS = (1, 4)  # operations per problem: uniform in this inclusive range

PEOPLE = [
    ("Tom", "He", "he"),
    ("Anna", "She", "she"),
    ("Ben", "He", "he"),
    ("Lily", "She", "she"),
    ("Sam", "He", "he"),
    ("Mia", "She", "she"),
    ("Max", "He", "he"),
    ("Emma", "She", "she"),
    ("Leo", "He", "he"),
    ("Zoe", "She", "she"),
    ("Omar", "He", "he"),
    ("Sara", "She", "she"),
]
ITEMS = [
    "apples",
    "marbles",
    "stickers",
    "books",
    "coins",
    "cookies",
    "pencils",
    "cards",
    "shells",
    "stamps",
    "balloons",
    "oranges",
]
SHOP_ITEMS = ["pens", "toys", "books", "hats", "cups", "bags", "lamps", "clocks"]
# Verb phrases without a subject: "{S} buys 15 more", joinable with "and".
STORY_OPS = {
    "+": ["buys {n} more", "finds {n} more", "gets {n} more", "receives {n} more"],
    "-": ["gives away {n}", "loses {n}", "sells {n}", "uses {n}"],
    "*": ["multiplies them by {n}"],
    "/": ["splits them into {n} equal piles and keeps one pile"],
}
SHOP_OPS = {
    "+": ["receives {n} more", "orders {n} more", "gets {n} more"],
    "-": ["sells {n}", "throws away {n}", "gives away {n}"],
    "*": ["multiplies its stock by {n}"],
    "/": ["splits them into {n} equal parts and keeps one part"],
}
STEP_OPS = {"+": "Add {n}", "-": "Subtract {n}", "*": "Multiply by {n}", "/": "Divide by {n}"}
FRAMINGS = (("story", 0.4), ("shop", 0.2), ("steps", 0.15), ("expression", 0.25))
OP_WEIGHTS = (("+", 0.35), ("-", 0.35), ("*", 0.15), ("/", 0.15))


@dataclass(frozen=True, slots=True)
class Problem:
    seed: int
    question: str
    solution: str  # step by step, ending with "The answer is N."
    answer: int
    num_ops: int
    framing: str


def _operand(rng: random.Random, high: int = 999) -> int:
    digits = rng.randint(1, 3)
    low, top = 10 ** (digits - 1), min(10**digits - 1, high)
    return rng.randint(low, top) if low <= top else rng.randint(1, high)


def _ops(rng: random.Random, start: int, count: int) -> list[tuple[str, int, int]]:
    """`count` feasible operations from `start`: (op, operand, result), results in [1, MAX_VALUE]."""
    value, steps = start, []
    for _ in range(count):
        feasible = []
        if value + 1 <= MAX_VALUE:
            feasible.append("+")
        if value >= 2:
            feasible.append("-")
        if value * 2 <= MAX_VALUE:
            feasible.append("*")
        if any(value % k == 0 for k in range(2, 10)):
            feasible.append("/")
        weights = [w for op, w in OP_WEIGHTS if op in feasible]
        op = rng.choices(feasible, weights)[0]
        if op == "+":
            n = _operand(rng, min(999, MAX_VALUE - value))
            value_next = value + n
        elif op == "-":
            n = _operand(rng, min(999, value - 1))
            value_next = value - n
        elif op == "*":
            n = rng.randint(2, min(9, MAX_VALUE // value))
            value_next = value * n
        else:
            n = rng.choice([k for k in range(2, 10) if value % k == 0])
            value_next = value // n
        steps.append((op, n, value_next))
        value = value_next
    return steps


def _story(rng: random.Random, start: int, steps: list, shop: bool) -> str:
    if shop:
        item = rng.choice(SHOP_ITEMS)
        subject, pronoun, intro = "The shop", "it", f"A shop has {start} {item}."
        table = SHOP_OPS
        question = rng.choice(
            [f"How many {item} does the shop have now?", f"How many {item} are in the shop now?"]
        )
    else:
        name, he, he_lower = rng.choice(PEOPLE)
        item = rng.choice(ITEMS)
        subject, pronoun = name, he_lower
        intro = rng.choice([f"{name} has {start} {item}.", f"{name} starts with {start} {item}."])
        table = STORY_OPS
        question = rng.choice(
            [
                f"How many {item} now?",
                f"How many {item} does {name} have now?",
                f"How many {item} does {he_lower} have in the end?",
            ]
        )
    phrases = [(op, rng.choice(table[op]).format(n=n)) for op, n, _ in steps]
    sentences, i = [], 0
    while i < len(phrases):
        first = not sentences
        who = (subject if rng.random() < 0.5 else pronoun.capitalize()) if first else pronoun
        lead = f"{who} " if first else rng.choice([f"Then {who} ", f"{who.capitalize()} "])
        op, text = phrases[i]
        # Join two operations with "and" unless one of them is a division ("... and keeps one").
        if i + 1 < len(phrases) and "/" not in (op, phrases[i + 1][0]) and rng.random() < 0.5:
            sentences.append(f"{lead}{text} and {phrases[i + 1][1]}.")
            i += 2
        else:
            sentences.append(f"{lead}{text}.")
            i += 1
    return " ".join([intro, *sentences, question])


def _steps_text(rng: random.Random, start: int, steps: list) -> str:
    parts = [f"Start with {start}."] + [f"{STEP_OPS[op].format(n=n)}." for op, n, _ in steps]
    return " ".join(parts + [rng.choice(["What is the result?", "What do you get?"])])


def _expression(rng: random.Random, start: int, steps: list) -> str:
    compact = rng.random() < 0.3
    expr, prev = str(start), None
    for op, n, _ in steps:
        if op in "*/" and prev in ("+", "-"):
            expr = f"({expr})"
        expr = f"{expr}{op}{n}" if compact else f"{expr} {op} {n}"
        prev = op
    return rng.choice([f"What is {expr}?", f"Compute {expr}.", f"Calculate {expr}."])


def generate(seed: int, ops: tuple[int, int] = OPS) -> Problem:
    """The problem of `seed` (any int): same seed, same problem, on every machine. `ops`: the
    inclusive range of the number of operations (uniform), 1-4 here; longer chains: a variant task
    (`dlmrt/tasks/arithmetic_chain.py`)."""
    rng = random.Random(seed)
    num_ops = rng.randint(*ops)
    framing = rng.choices([f for f, _ in FRAMINGS], [w for _, w in FRAMINGS])[0]
    start = _operand(rng)
    if framing in ("story", "shop") and start == 1:
        start = 2  # "has 2 apples", never "has 1 apples"
    steps = _ops(rng, start, num_ops)
    if framing in ("story", "shop"):
        question = _story(rng, start, steps, shop=framing == "shop")
    elif framing == "steps":
        question = _steps_text(rng, start, steps)
    else:
        question = _expression(rng, start, steps)
    equations, value = [], start
    for op, n, result in steps:
        equations.append(f"{value} {op} {n} = {result}.")
        value = result
    solution = " ".join(equations + [f"{ANSWER_PREFIX} {value}."])
    return Problem(seed, question, solution, value, num_ops, framing)


def is_test(question: str) -> bool:
    """Whether a question text belongs to the held-out (test) split."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") % TEST_BUCKETS == 0


def iter_split(split: str, start_seed: int = 0, ops: tuple[int, int] = OPS) -> Iterator[Problem]:
    """Problems of `split` ("train" or "test") in seed order, from the split's `start_seed`-th seed."""
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    offset = TEST_SEED_OFFSET if split == "test" else 0
    seed = offset + start_seed
    while True:
        problem = generate(seed, ops)
        if is_test(problem.question) == (split == "test"):
            yield problem
        seed += 1


def problems(split: str, count: int, ops: tuple[int, int] = OPS) -> list[Problem]:
    """The first `count` problems of `split` (the test set of an evaluation)."""
    it = iter_split(split, 0, ops)
    return [next(it) for _ in range(count)]


_ANSWER_RE = re.compile(re.escape(ANSWER_PREFIX) + r"\s*(-?\d+)(?!\d)")


def extract_answer(text: str) -> int | None:
    """The integer right after the last "The answer is" in `text`, or None if there is none."""
    last = text.rfind(ANSWER_PREFIX)
    if last < 0:
        return None
    match = _ANSWER_RE.match(text, last)
    return int(match.group(1)) if match else None


def verify(text: str, answer: int) -> bool:
    """True iff the text's final answer (see `extract_answer`) equals `answer`."""
    return extract_answer(text) == answer
