"""benchmarks/rounds/ttft.py on the CPU (tiny random models, eager): every family's 3-turn
conversation gives one row per (context, reuse, turn); reused turns report cached tokens and
prefill fewer rows than cold ones, with the same answers (fp32); `--stream` is passed on only where
`LLM` takes `stream_rounds`. The GPU timings themselves: test_ttft_gpu.py and the script."""

from __future__ import annotations

import json

import pytest
from benchmark_modules import benchmark

SMOKE = ["--tiny", "--device", "cpu", "--max-new-tokens", "8", "--user-tokens", "8",
         "--repeats", "1", "--warmups", "1"]  # fmt: skip
# two contexts (the arena grows between them) where requests are cheapest on the CPU
CONTEXTS = {"qwen_dlm": (24, 40), "llada2": (24,), "diffusion_gemma": (24,)}


@pytest.mark.parametrize("model", sorted(CONTEXTS))
def test_the_smoke_run_reuses_the_previous_turn(model, tmp_path, capsys):
    out, contexts = tmp_path / "ttft.json", CONTEXTS[model]
    args = ["--model", model, *SMOKE, "--contexts", ",".join(map(str, contexts))]
    benchmark("rounds.ttft").main([*args, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["git_revision"] and result["date"]
    assert result["stream"] == "on"  # the default: tokens every round
    assert result["command"].startswith(" ".join(["python -m benchmarks.rounds.ttft", *args]))
    rows = result["rows"]
    assert len(rows) == len(contexts) * 2 * 3  # contexts x (cold, reused) x turns
    by = {(r["context"], r["prefix_reuse"], r["turn"]): r for r in rows}
    for context in contexts:
        lengths = [by[context, True, t]["prompt_tokens"] for t in (1, 2, 3)]
        assert lengths == [context, context + 16, context + 32]  # + answer + user tokens
        for turn in (1, 2, 3):
            cold, reused = by[context, False, turn], by[context, True, turn]
            assert cold["cached_tokens"] == 0 and cold["prefill_rows"] > 0
            assert reused["same_tokens_as_cold"]  # fp32 on the CPU: identical
            for r in (cold, reused):
                assert 0 < r["ttft_ms"] <= r["request_ms"] and r["prefill_ms"] > 0
            if turn == 1:  # a new conversation reuses nothing
                assert reused["cached_tokens"] == 0
                assert reused["prefill_rows"] == cold["prefill_rows"]
            else:
                assert reused["cached_tokens"] > 0
                assert reused["prefill_rows"] < cold["prefill_rows"]
    table = capsys.readouterr().out  # the markdown table: one line per context and turn
    assert all(table.count(f"\n| {c} |") == 3 for c in contexts)


def test_stream_is_passed_on_as_stream_rounds():
    models = benchmark("rounds.ttft_models")
    assert models.stream_option("on") == ({"stream_rounds": True}, "on")
    assert models.stream_option("off") == ({"stream_rounds": False}, "off")
    with pytest.raises(ValueError, match="--stream"):
        models.stream_option("maybe")


def test_the_full_size_models_are_the_model_shapes():
    from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini, qwen_dlm_4b

    models = benchmark("rounds.ttft_models")
    assert models.full_config("qwen_dlm", None) == qwen_dlm_4b()
    assert models.full_config("llada2", 4) == llada21_mini(4)
    assert models.full_config("diffusion_gemma", None) == diffusion_gemma_26b()


def test_a_diffusion_gemma_without_full_layers_generates():
    """`--layers 2` cuts DiffusionGemma-26B to two sliding layers: the model builds RoPE tables
    only for the layer kinds it has (a full layer's table failed its lookup on such a model)."""
    from dataclasses import replace

    import torch

    from dlmrt.models.diffusion_gemma import DiffusionGemma

    models = benchmark("rounds.ttft_models")
    cfg = models.tiny_config("diffusion_gemma")
    cfg = replace(cfg, layer_types=cfg.layer_types[:1],
                  head_dims=cfg.head_dims[:1], kv_heads=cfg.kv_heads[:1])  # fmt: skip
    assert set(cfg.layer_types) != set(cfg.rope)  # a rope kind without a layer
    bench = models.Bench("diffusion_gemma", models.random_model(
        cfg, torch.device("cpu"), torch.float32, cls=DiffusionGemma), 4)  # fmt: skip
    llm = models.make_llm(bench, "eager", True, {})
    out = llm.generate([5, 6, 7, 8, 9], **bench.request(8))
    assert len(out.token_ids) == 8
