"""GPU: benchmarks/rounds/ttft.py at a small shape (full widths, a few layers, bf16, block_graph):
the conversation's reused turns serve the previous request's rows and prefill fewer, every
request streams its first token no later than it ends, `--stream on` recorded. Tokens are not compared: bf16 reuse may round differently from a cold
prefill (docs/prefix-reuse.md, "Exactness"); the script reports `same_tokens_as_cold`.

Run on the device machine: pytest -m gpu tests/bench/test_ttft_gpu.py
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
LAYERS = {"qwen_dlm": 2, "llada2": 2, "diffusion_gemma": 6}  # DiffusionGemma: layer 5 is full


@pytest.mark.parametrize("model", sorted(LAYERS))
def test_a_small_shape_reuses_the_previous_turn(model, tmp_path):
    out = tmp_path / "ttft.json"
    args = ["--model", model, "--layers", str(LAYERS[model]), "--contexts", "1024,2048"]
    args += ["--repeats", "1", "--stream", "on", "--out", str(out)]
    benchmark("rounds.ttft").main(args)
    result = json.loads(out.read_text())
    assert result["device"] != "cpu" and result["mode"] == "block_graph"
    assert result["stream"] == "on"
    assert result["shape"]["layers"] == LAYERS[model]
    by = {(r["context"], r["prefix_reuse"], r["turn"]): r for r in result["rows"]}
    assert len(by) == len(result["rows"]) == 2 * 2 * 3
    for context in (1024, 2048):
        for turn in (1, 2, 3):
            cold, reused = by[context, False, turn], by[context, True, turn]
            assert cold["prompt_tokens"] == reused["prompt_tokens"]
            assert cold["cached_tokens"] == 0 and cold["prefill_rows"] > 0
            assert cold["prefill_ms"] > 0
            for r in (cold, reused):
                assert 0 < r["ttft_ms"] <= r["request_ms"] and r["ms_per_round"] > 0
            if turn > 1:
                assert reused["cached_tokens"] >= context // 2
                assert reused["prefill_rows"] < cold["prefill_rows"]
