"""HumanEval verdicts from the judge (dlmrt/bench/judge.py): the three reward hacks of a wrong
solution (the caller's frames, /proc/self/mem, an always-equal object) fail in every isolation
mode, and ordinary solutions keep their verdicts (tuples, floats, helpers of the prompt, errors,
timeouts)."""

from __future__ import annotations

import textwrap

import pytest
from isolation_modes import isolation_mode  # noqa: F401 (the `mode` fixture)

from dlmrt.bench.humaneval_runner import check_completion

ADD_PROMPT = 'def add(a, b):\n    """Add."""\n'
ADD_TEST = (
    "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
)

# (a) the pass secret and the report pipe from a caller's frame, written as the wrapper would
FRAMES = textwrap.dedent("""\
        import os, sys
        f = sys._getframe(1)
        while f is not None:
            if "secret" in f.f_locals and "report_fd" in f.f_locals:
                os.write(int(f.f_locals["report_fd"]), f.f_locals["secret"])
                os._exit(0)
            f = f.f_back
        return 0
""")
# (b) every hex token in the process's own memory, written to every fd, then exit 0
MEMORY = textwrap.dedent("""\
        import os, re
        found = set()
        with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if "r" not in perms or "[v" in line:
                    continue
                lo, hi = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(lo)
                    found.update(re.findall(rb"[0-9a-f]{32}", mem.read(min(hi - lo, 1 << 26))))
                except OSError:
                    pass
        for token in sorted(found)[:2000]:
            for fd in range(1, 32):
                try:
                    os.write(fd, token)
                except OSError:
                    pass
        os._exit(0)
""")
# (c) an object equal to everything
ALWAYS_EQUAL = textwrap.dedent("""\
        class Anything:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
        return Anything()
""")


def _indent(code: str) -> str:
    return textwrap.indent(code, "    ")


@pytest.mark.parametrize("attack", ["frames", "memory", "always_equal"])
def test_reward_hacks_of_a_wrong_solution_fail(mode, attack):
    body = {"frames": FRAMES, "memory": MEMORY, "always_equal": ALWAYS_EQUAL}[attack]
    result = check_completion(ADD_PROMPT, _indent(body), ADD_TEST, "add", timeout_s=20)
    assert result.status == "failed", result


def test_an_int_subclass_equal_to_everything_fails(mode):
    body = "    class I(int):\n        def __eq__(self, o):\n            return True\n    return I(0)\n"
    result = check_completion(ADD_PROMPT, body, ADD_TEST, "add")
    assert result.status == "failed" and "not plain data" in result.stderr_tail, result


def test_ordinary_verdicts(mode):
    assert check_completion(ADD_PROMPT, "    return a + b\n", ADD_TEST, "add").passed
    wrong = check_completion(ADD_PROMPT, "    return a - b\n", ADD_TEST, "add")
    assert wrong.status == "failed" and "AssertionError" in wrong.stderr_tail
    raises = check_completion(ADD_PROMPT, "    raise KeyError('x')\n", ADD_TEST, "add")
    assert raises.status == "failed" and "KeyError" in raises.stderr_tail
    broken = check_completion(ADD_PROMPT, "    return (\n", ADD_TEST, "add")
    assert broken.status == "failed" and "SyntaxError" in broken.stderr_tail
    loop = check_completion(ADD_PROMPT, "    while True:\n        pass\n", ADD_TEST, "add", 2)
    assert loop.status == "timeout"


def test_values_keep_their_types_and_the_prompts_helpers_are_the_judges(mode):
    """A tuple stays a tuple (HumanEval compares `== (0, 1)`), floats compare by tolerance, and a
    test may call a helper the prompt defines (HumanEval/32's `poly`)."""
    prompt = textwrap.dedent('''\
        def poly(xs, x):
            return sum(c * x**i for i, c in enumerate(xs))


        def stats(xs):
            """(zero of poly(xs), (min, max))."""
    ''')
    completion = "    return 0.5, (min(xs), max(xs))\n"
    test = textwrap.dedent("""\
        def check(candidate):
            zero, span = candidate([-1.0, 2.0])
            assert abs(poly([-1.0, 2.0], zero)) < 1e-9
            assert span == (-1.0, 2.0) and type(span) is tuple
            assert candidate(xs=[3]) == (0.5, (3, 3))
    """)
    assert check_completion(prompt, completion, test, "stats").passed
    as_list = check_completion(prompt, "    return [0.5, [min(xs), max(xs)]]\n", test, "stats")
    assert as_list.status == "failed"


def test_the_judges_random_state_is_restored():
    import random

    random.seed(7)
    want = random.random()
    random.seed(7)
    test = (
        "import random\nrandom.seed(123)\ndef check(candidate):\n    assert candidate(1, 1) == 2\n"
    )
    assert check_completion(ADD_PROMPT, "    return a + b\n", test, "add").passed
    assert random.random() == want


# answers the first call itself on the report pipe, then never reads another request
STOPS_READING = textwrap.dedent("""\
        import os, sys, time
        f = sys._getframe(1)
        while "report_fd" not in f.f_locals:
            f = f.f_back
        os.write(int(f.f_locals["report_fd"]), b"ok 5\\n")
        time.sleep(60)
""")


def test_a_candidate_that_stops_reading_its_calls_times_out(mode):
    """The next request, larger than the pipe holds, is written under the deadline: the judge
    does not block on a candidate that never reads it."""
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n    candidate('x' * 10**6, 0)\n"
    result = check_completion(ADD_PROMPT, _indent(STOPS_READING), test, "add", timeout_s=2)
    assert result.status == "timeout" and result.elapsed_s < 20, result


def test_a_test_catching_exception_cannot_swallow_the_deadline(mode):
    test = "def check(candidate):\n    try:\n        candidate(2, 3)\n    except Exception:\n        pass\n"
    loop = check_completion(ADD_PROMPT, "    while True:\n        pass\n", test, "add", 2)
    assert loop.status == "timeout", loop
