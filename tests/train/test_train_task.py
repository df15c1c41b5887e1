"""The arithmetic task: deterministic per seed, correct solutions, verifier, disjoint splits."""

from __future__ import annotations

import re

import pytest

from dlmrt.tasks import arithmetic as task
from dlmrt.tasks import get_task
from dlmrt.tasks.sum_set import MAX_RESPONSE_CHARS


def _eval_chain(solution: str) -> int:
    """Re-check every equation of a solution; return the final value."""
    value = None
    for a, op, b, r in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)\.", solution):
        a, b, r = int(a), int(b), int(r)
        assert value is None or a == value, solution  # each step continues the previous one
        expected = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        assert r == expected and (op != "/" or a % b == 0), solution
        value = r
    return value


def test_generator_is_deterministic_per_seed():
    for seed in (0, 1, 7, 12345, 10**9 + 3):
        assert task.generate(seed) == task.generate(seed)
    questions = {task.generate(s).question for s in range(200)}
    assert len(questions) > 190  # different seeds, (almost always) different problems
    assert task.problems("test", 5) == task.problems("test", 5)
    # Pinned: the generator is part of the data contract (a changed generator changes the runs).
    assert task.generate(0).solution == (
        "15 + 597 = 612. 612 - 71 = 541. 541 + 9 = 550. 550 + 2 = 552. The answer is 552."
    )


def test_problems_are_correct_and_cover_the_difficulty_range():
    problems = [task.generate(s) for s in range(3000)]
    assert {p.num_ops for p in problems} == {1, 2, 3, 4}
    assert {p.framing for p in problems} == {"story", "shop", "steps", "expression"}
    for p in problems:
        assert _eval_chain(p.solution) == p.answer
        assert p.solution.endswith(f"The answer is {p.answer}.")
        assert len(re.findall(r" = ", p.solution)) == p.num_ops
        assert 1 <= p.answer <= task.MAX_VALUE
        assert all(len(n) <= 3 for n in re.findall(r"\d+", p.question))  # operands <= 3 digits
        assert task.verify(p.solution, p.answer)
    ops = {op for p in problems for op in re.findall(r" ([-+*/]) \d+ =", p.solution)}
    assert ops == {"+", "-", "*", "/"}


def test_expression_problems_respect_precedence():
    for s in range(2000):
        p = task.generate(s)
        if p.framing == "expression":
            expr = re.match(r"(?:What is|Compute|Calculate) (.*)[?.]$", p.question).group(1)
            assert eval(expr.replace("/", "//")) == p.answer, p.question  # exact divisions


def test_verifier_accepts_right_and_rejects_wrong_or_malformed():
    assert task.verify("12 + 30 = 42. The answer is 42.", 42)
    assert task.verify("The answer is 42", 42)
    assert task.verify("The answer is 41. The answer is 42.", 42)  # the last one counts
    assert task.verify("blah The answer is  7.<|im_end|>", 7)
    assert not task.verify("The answer is 41.", 42)
    assert not task.verify("12 + 30 = 42.", 42)  # no answer sentence
    assert not task.verify("", 42)
    assert not task.verify("The answer is", 42)
    assert not task.verify("The answer is forty-two.", 42)
    assert not task.verify("The answer is 420.", 42)
    assert not task.verify("the answer is 42.", 42)  # fixed format, case-sensitive
    assert task.extract_answer("The answer is 42. The answer is x") is None


def test_splits_are_disjoint_by_question_text():
    test = task.problems("test", 300)
    assert all(task.is_test(p.question) for p in test)
    assert all(p.seed >= task.TEST_SEED_OFFSET for p in test)
    train_it = task.iter_split("train")
    train = [next(train_it) for _ in range(3000)]
    assert not any(task.is_test(p.question) for p in train)
    assert not {p.question for p in test} & {p.question for p in train}


def test_registry():
    assert get_task("arithmetic") is task
    with pytest.raises(ValueError, match="unknown task"):
        get_task("sudoku")


def test_arithmetic_chain_has_three_to_eight_correct_steps_and_its_own_split():
    chain = get_task("arithmetic_chain")
    problems = [chain.generate(s) for s in range(1500)]
    assert {p.num_ops for p in problems} == set(range(3, 9))
    for p in problems[:300]:
        assert _eval_chain(p.solution) == p.answer and chain.verify(p.solution, p.answer)
        assert len(p.solution) <= chain.MAX_RESPONSE_CHARS
    test = chain.problems("test", 50)
    assert all(task.is_test(p.question) for p in test)
    train_questions = {p.question for p, _ in zip(chain.iter_split("train"), range(3000))}
    assert not train_questions & {p.question for p in test}
    assert task.generate(5) == task.generate(5, task.OPS)  # arithmetic itself is unchanged


def test_sum_set_solutions_verify_and_many_answers_are_right():
    """Each solution is a valid set; other valid sets verify too (the point of the task), and the
    near misses do not."""
    sums = get_task("sum_set")
    problems = [sums.generate(s) for s in range(2000)]
    assert {p.answer[0] for p in problems} == set(range(3, 7))
    for p in problems[:300]:
        k, high, target = p.answer
        assert sums.verify(p.solution, p.answer) and len(p.solution) <= MAX_RESPONSE_CHARS
        assert len(p.numbers) == k and sum(p.numbers) == target and p.numbers[-1] <= high
    p = next(q for q in problems if q.answer == (3, q.answer[1], q.answer[2]) and q.answer[2] > 12)
    k, high, target = p.answer
    other = (1, 2, target - 3)  # another valid set, whenever target - 3 fits the range
    if 2 < target - 3 <= high:
        assert sums.verify(f"The answer is {', '.join(map(str, other))}.", p.answer)
    a, b, c = p.numbers
    assert not sums.verify(f"The answer is {a}, {b}, {c + 1}.", p.answer)  # wrong sum
    assert not sums.verify(f"The answer is {b}, {a}, {c}.", p.answer)  # not increasing
    assert not sums.verify(f"The answer is {a}, {b}.", p.answer)  # too few
    assert not sums.verify(f"The answer is {a}, {a}, {target - 2 * a}.", p.answer)  # repeats
    assert not sums.verify(f"The answer is 0, {a}, {target - a}.", p.answer)  # out of range
    assert not sums.verify("no answer", p.answer)


def test_sum_set_splits_share_no_question_content():
    """Held out by the (k, high, target) triple: no test triple is trained on in any framing."""
    sums = get_task("sum_set")
    test = sums.problems("test", 200)
    train = {p.answer for p, _ in zip(sums.iter_split("train"), range(5000))}
    assert not train & {p.answer for p in test}
    assert sums.generate(7) == sums.generate(7)  # deterministic


def test_sum_set_small_narrows_the_ranges_and_keeps_the_split():
    """The narrow variant draws k in 3-4 and tops in 12-40, verifies as sum_set does, and holds
    out the same way (by the triple)."""
    small = get_task("sum_set_small")
    problems = [small.generate(s) for s in range(1000)]
    assert {p.answer[0] for p in problems} == {3, 4}
    assert {p.answer[1] for p in problems} == set(range(12, 41))
    assert all(small.verify(p.solution, p.answer) for p in problems)
    test = small.problems("test", 100)
    train = {p.answer for p, _ in zip(small.iter_split("train"), range(3000))}
    assert not train & {p.answer for p in test}
