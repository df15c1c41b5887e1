"""ORL's math task: problems from a JSONL file (bench formats), the bench's math scorer."""

from __future__ import annotations

import json

import pytest

from dlmrt.tasks import arithmetic
from dlmrt.train.orl.capture import Rollout
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.rollout import VerifierPool, step_prompts
from dlmrt.train.orl.tasks import resolve_task


def _file(tmp_path, n=40):
    rows = [
        {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
        for i in range(n)
    ]
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_math_task_splits_cycles_and_verifies(tmp_path):
    path = str(_file(tmp_path))
    task = resolve_task("math", path)
    train, test = task.split["train"], task.split["test"]
    assert len(train) + len(test) == 40 and train
    assert all(arithmetic.is_test(p.question) for p in test)
    cfg = ORLConfig(task="math", data=path, prompts_per_step=3)
    prompts = step_prompts(task, cfg, len(train))  # past the end: the train split cycles
    assert [p.question for p in prompts] == [
        train[i % len(train)].question for i in range(3 * len(train), 3 * len(train) + 3)
    ]
    assert "\\boxed{}" in prompts[0].question and "####" in prompts[0].answer
    good = Rollout(0, [], [], "so \\boxed{14}", "7 + 7 = 14\n#### 14", [], 0)
    bad = Rollout(0, [], [], "The answer is 15.", "7 + 7 = 14\n#### 14", [], 0)
    VerifierPool("math", path, 0).verify([good, bad])
    assert (good.verified, bad.verified) == (True, False)


def test_math_task_needs_data_and_only_it(tmp_path):
    with pytest.raises(ValueError, match="data: needed by the tasks math and code"):
        ORLConfig(task="math")
    with pytest.raises(ValueError, match="data: needed by the tasks math and code"):
        ORLConfig(data=str(_file(tmp_path)))
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        ORLConfig(task="chess")


def test_code_task_verifies_in_the_sandbox(tmp_path):
    rows = [
        {
            "task_id": f"t/{i}",
            "prompt": f'def add{i}(a, b):\n    """a + b"""\n',
            "test": "def check(f):\n    assert f(2, 3) == 5\n",
            "entry_point": f"add{i}",
        }
        for i in range(3)
    ]
    path = tmp_path / "he.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = resolve_task("code", str(path))
    p = task.rows[0]
    assert "```python" in p.question and p.answer[2] == "add0"
    good = Rollout(0, [], [], "```python\ndef add0(a, b):\n    return a + b\n```", p.answer, [], 0)
    bad = Rollout(0, [], [], "    return a - b\n", p.answer, [], 0)
    VerifierPool("code", str(path), 0).verify([good, bad])
    assert (good.verified, bad.verified) == (True, False)
    with pytest.raises(ValueError, match="holds code problems, not math"):
        resolve_task("math", str(path))
