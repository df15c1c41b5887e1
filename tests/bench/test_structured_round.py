"""benchmarks/rounds/structured_round.py on the CPU (tiny random models, eager): one unconstrained
and one constrained run, the constrained output valid under its format, grammar host time only
where there is a grammar, the result file's metadata; and its byte-level tokenizer at a full
model's vocabulary: llguidance compiles over it and never allows the mask or padding rows. The
GPU timings: test_structured_round_gpu.py and the script."""

from __future__ import annotations

import json

import pytest
from benchmark_modules import benchmark

llguidance = pytest.importorskip("llguidance")


@pytest.mark.parametrize("model,fmt", [("qwen_dlm", "regex"), ("llada2", "json")])
def test_the_smoke_run_decodes_through_the_grammar(model, fmt, tmp_path, capsys):
    out = tmp_path / "structured_round.json"
    args = ["--model", model, "--tiny", "--device", "cpu", "--format", fmt, "--iters", "1"]
    benchmark("rounds.structured_round").main([*args, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["git_revision"] and result["date"]
    assert result["benchmark"] == "structured_round" and result["format"] == fmt
    free, bound = result["results"]
    assert (free["format"], bound["format"]) == ("none", fmt)
    assert free["mode"] == bound["mode"] == "eager"
    assert bound["valid"] is True
    assert free["grammar_ms_per_round"] == 0 and bound["grammar_ms_per_round"] > 0
    for row in (free, bound):
        assert row["tokens"] == 16 and row["rounds"] == row["denoising_forwards"] > 0
        assert row["ms_per_round"] > 0
        assert row["ms_per_round"] == pytest.approx(row["ms_per_request"] / row["rounds"], 1e-2)
    if fmt == "json":  # `{"text":"` is forced: committed with no forward
        assert bound["forced_tokens"] >= 9
    printed = capsys.readouterr().out
    assert "| run | ms / round |" in printed and f"| eager + {fmt} |" in printed


def test_the_stand_in_tokenizer_spans_the_models_vocabulary():
    from dlmrt.model_shapes import qwen_dlm_4b
    from dlmrt.structured.formats import parse
    from dlmrt.structured.grammar import grammars_for

    cfg = qwen_dlm_4b(1)
    tok = benchmark("rounds.byte_tokenizer").ByteTokenizer(cfg.mask_token_id)
    assert len(tok) == cfg.mask_token_id + 1 and tok.stop_id == cfg.mask_token_id - 1
    assert tok.decode(tok.encode("a b {}")) == "a b {}"
    grammars = grammars_for(tok, cfg.vocab_size, set(tok.stop_ids))
    c = grammars.constraint(parse({"type": "regex", "regex": "[a-z ]+"}), 8)
    ok = c.allowed()
    assert ok.shape == (cfg.vocab_size,)
    assert ok[ord("a")] and ok[ord(" ")] and not ok[ord("A")]
    assert 256 < int(ok.sum()) < cfg.vocab_size // 20  # fillers of [a-z ] only: a small share
    assert not ok[cfg.mask_token_id :].any() and not ok[tok.stop_id]  # nothing taken yet: no stop
    assert c.take([ord("a")]) == 1 and c.allowed()[tok.stop_id]


def test_a_mask_id_too_small_for_the_bytes_is_refused():
    with pytest.raises(ValueError, match="mask_token_id"):
        benchmark("rounds.byte_tokenizer").tokenizer_json(100)
