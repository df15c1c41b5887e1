"""GPU: benchmarks/rounds/structured_round.py at a small shape (full widths, 2 layers, bf16):
unconstrained block_graph and round_graph, then the constrained run round by round; its output
valid under the format, grammar time only where there is a grammar.

Run on the device machine: pytest -m gpu tests/bench/test_structured_round_gpu.py
"""

from __future__ import annotations

import json

import pytest
import torch
from benchmark_modules import benchmark

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
llguidance = pytest.importorskip("llguidance")


@pytest.mark.parametrize("model,fmt", [("qwen_dlm", "regex"), ("llada2", "json")])
def test_a_small_shape_times_rounds_with_the_grammar(model, fmt, tmp_path):
    out = tmp_path / "structured_round.json"
    args = ["--model", model, "--layers", "2", "--format", fmt, "--iters", "2"]
    benchmark("rounds.structured_round").main([*args, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["device"] != "cpu" and result["shape"]["layers"] == 2
    assert result["shape"]["dtype"] == "torch.bfloat16"
    rows = result["results"]
    assert [(r["mode"], r["format"]) for r in rows] == [
        ("block_graph", "none"),
        ("round_graph", "none"),
        ("round_graph", fmt),
    ]
    assert rows[2]["engine_mode"] == "round_graph" and rows[2]["valid"] is True
    assert rows[2]["grammar_ms_per_round"] > 0
    for r in rows:
        assert r["tokens"] == 256 and r["rounds"] > 0 and r["ms_per_round"] > 0
    for r in rows[:2]:
        assert r["grammar_ms_per_round"] == 0 and r["forced_tokens"] == 0
