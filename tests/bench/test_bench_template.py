"""A checkpoint's own benchmark prompt template (generation_config.json): the embedded demo ships
one, `dlmrt bench` uses it unless --prompt-template is given, and the report says which it used."""

from __future__ import annotations

import json

import pytest
import torch

from dlmrt.bench.datasets import CHECKPOINT_TEMPLATES, TEMPLATES, pick_template
from dlmrt.cli import main
from dlmrt.demo import demo_model_path
from dlmrt.tasks import arithmetic


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_demo_scores_on_its_own_template(tmp_path, one_thread):
    rows = [
        {"question": p.question, "answer": f"{p.solution}\n#### {p.answer}"}
        for p in arithmetic.problems("test", 10)
    ]
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report.json"
    args = ["bench", "--dataset", str(data), "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["prompt_template"] == "{prompt}"
    assert report["prompt_template_source"] == "checkpoint (generation_config.json)"
    assert report["runs"][0]["summary"]["accuracy"] >= 0.7  # the default instruction: ~20%


def test_template_precedence_and_errors(tmp_path):
    demo = demo_model_path()
    assert pick_template("Q: {prompt}", demo, "math", True) == ("Q: {prompt}", "--prompt-template")
    assert pick_template(None, demo, "code", True) == (TEMPLATES[("code", True)], "default")
    assert pick_template(None, tmp_path, "math", False) == (TEMPLATES[("math", False)], "default")
    (tmp_path / "generation_config.json").write_text(
        json.dumps({CHECKPOINT_TEMPLATES: {"math": "x"}})
    )
    with pytest.raises(ValueError, match=r"the 'math' template has no '\{prompt\}'"):
        pick_template(None, tmp_path, "math", True)
    (tmp_path / "generation_config.json").write_text(json.dumps({CHECKPOINT_TEMPLATES: "x"}))
    with pytest.raises(ValueError, match="must map 'math' / 'code' to template strings"):
        pick_template(None, tmp_path, "math", True)
