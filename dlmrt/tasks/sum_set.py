"""Sum sets: "Write 4 different whole numbers from 1 to 30, in increasing order, that add up to 62."

Why a third task (issue 17): on `arithmetic_chain` ORL did not move the accuracy-vs-TPF frontier,
and the round profile says why (docs/orl-demo.md): the Base model's extra rounds wait for results
that depend on earlier results in the same block, a dependency no residual can skip. ORL's claim
is about a different cause of slow decoding: a model that spreads its probability over several
right answers. Here every question has many valid answers (the k-subsets of 1..high with that
sum), and SFT trains on one drawn at random, so a Base model's per-position marginals stay spread
over the modes: a confidence rule commits few positions per round, and committing in parallel
from different modes breaks the sum. A policy trained on its own verified rollouts can settle on
one mode per question (the on-policy part) and contract its entropy faster (AEC): more tokens per
forward at the same validity. Nothing in an answer depends on a result computed in the block.

A question is a count k (3-6), a range 1..high (high 12-99) and a target sum (the narrow
variant `sum_set_small`: k 3-4, high 12-40); the SFT solution
is a uniformly random valid set (a random k-subset of 1..high, whose sum sets the target), as the
equation and the answer sentence:

  "3 + 8 + 14 + 21 = 46. The answer is 3, 8, 14, 21."

`verify` checks the numbers after the last "The answer is": k of them, strictly increasing, each
in 1..high, summing to the target. The held-out split is the 1/32 hash bucket of the
(k, high, target) triple, not of the text, so no test question's content is ever trained on
under another framing; train problems come from seeds 0, 1, ..., test from 10**9, ....
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

TEST_SEED_OFFSET = 10**9
TEST_BUCKETS = 32
ANSWER_PREFIX = "The answer is"
MAX_RESPONSE_CHARS = 80  # 6 two-digit numbers twice, the separators and the sentence
FRAMINGS = (
    "Write {k} different whole numbers from 1 to {high}, in increasing order, that add up to {t}.",
    "Pick {k} distinct numbers between 1 and {high} whose sum is {t}. List them smallest first.",
    "Find {k} different numbers, each from 1 to {high}, with a total of {t}. Give them in "
    "increasing order.",
    "{name} wants {k} cards with different numbers from 1 to {high} adding up to {t}. Which "
    "cards, in increasing order?",
)
NAMES = ("Tom", "Ana", "Lee", "Mia", "Sam", "Ravi", "Zoe", "Ben", "Ida", "Kai")


@dataclass(frozen=True, slots=True)
class Problem:
    seed: int
    question: str
    solution: str  # "a + b + ... = t. The answer is a, b, ...."
    answer: tuple[int, int, int]  # (k, high, target): what `verify` checks against
    numbers: tuple[int, ...]  # the SFT solution's set (one of many valid ones)


@dataclass(frozen=True, slots=True)
class SumSet:
    """The task over counts k in `counts` and range tops in `highs` (both inclusive).

    A task object: `generate`, `iter_split`, `problems` and `verify`, as the task modules have.
    """

    name: str
    counts: tuple[int, int]
    highs: tuple[int, int]

    def generate(self, seed: int) -> Problem:
        """The problem of `seed` (deterministic)."""
        rng = random.Random(seed)
        k = rng.randint(*self.counts)
        high = rng.randint(max(self.highs[0], 2 * k), self.highs[1])
        numbers = tuple(sorted(rng.sample(range(1, high + 1), k)))
        target = sum(numbers)
        framing = rng.choice(FRAMINGS)
        question = framing.format(k=k, high=high, t=target, name=rng.choice(NAMES))
        listed = ", ".join(map(str, numbers))
        solution = f"{' + '.join(map(str, numbers))} = {target}. {ANSWER_PREFIX} {listed}."
        return Problem(seed, question, solution, (k, high, target), numbers)

    def iter_split(self, split: str, start_seed: int = 0) -> Iterator[Problem]:
        """Problems of `split` ("train" or "test") in seed order, from its `start_seed`-th seed."""
        if split not in ("train", "test"):
            raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
        seed = (TEST_SEED_OFFSET if split == "test" else 0) + start_seed
        while True:
            problem = self.generate(seed)
            if _is_test_answer(problem.answer) == (split == "test"):
                yield problem
            seed += 1

    def problems(self, split: str, count: int) -> list[Problem]:
        """The first `count` problems of `split` (the test set of an evaluation)."""
        it = self.iter_split(split, 0)
        return [next(it) for _ in range(count)]

    @staticmethod
    def verify(text: str, answer: tuple[int, int, int]) -> bool:
        """True iff the final answer is k strictly increasing numbers in 1..high summing to target."""
        return verify(text, answer)


def _is_test_answer(answer: tuple[int, int, int]) -> bool:
    digest = hashlib.sha256("|".join(map(str, answer)).encode()).digest()
    return int.from_bytes(digest[:4], "little") % TEST_BUCKETS == 0


_LIST_RE = re.compile(r"\s*(\d+(?:\s*,\s*\d+)*)")


def extract_numbers(text: str) -> list[int] | None:
    """The comma-separated integers right after the last "The answer is", or None."""
    last = text.rfind(ANSWER_PREFIX)
    match = _LIST_RE.match(text, last + len(ANSWER_PREFIX)) if last >= 0 else None
    return [int(n) for n in match.group(1).split(",")] if match else None


def verify(text: str, answer: tuple[int, int, int]) -> bool:
    """True iff the final answer is k strictly increasing numbers in 1..high summing to target."""
    k, high, target = answer
    numbers = extract_numbers(text)
    if numbers is None or len(numbers) != k or sum(numbers) != target:
        return False
    increasing = all(a < b for a, b in zip(numbers, numbers[1:]))
    return increasing and 1 <= numbers[0] and numbers[-1] <= high


SUM_SET = SumSet("sum_set", counts=(3, 6), highs=(12, 99))
# The narrow variant (k 3-4, tops 12-40): sums a 6-layer model can keep consistent, still with
# many valid answers per question (docs/orl-demo.md: the sum_set Base runs).
SUM_SET_SMALL = SumSet("sum_set_small", counts=(3, 4), highs=(12, 40))
