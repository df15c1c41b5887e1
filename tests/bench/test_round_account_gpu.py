"""`python -m benchmarks.rounds.account` on a GPU at the families' real widths with two layers:
the CUDA kernels map to labels (few unlabelled), the GEMMs and attention get floors the kernels
do not beat by more than the copy bandwidth's measurement error, and the result file is written."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from benchmark_modules import benchmark

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# per family: op kinds every layer must show (CUDA: q|k|v stacked, one norm + RoPE kernel)
KINDS = {
    "qwen_dlm": ["self_attn.qkv", "self_attn.qk_norm_rope", "self_attn.attention", "mlp.gate_up"],
    "llada2": ["attention.query_key_value", "attention.attention", "attention.dense"],
    "diffusion_gemma": ["self_attn.qkv", "self_attn.attention", "experts", "router.route"],
}


@pytest.mark.parametrize("family", list(KINDS))
def test_account_of_a_two_layer_round(family):
    build = benchmark("rounds.round_latency").build
    round_fn = benchmark("rounds.profile_round").round_fn
    model, rule, _, _ = build(family, 2)
    result = benchmark("rounds.account").take_account(model, round_fn(family, model, rule, 256))
    kinds = {r["kind"]: r for r in result["kinds"]}
    for kind in KINDS[family]:
        row = kinds[f"layers.*.{kind}"]
        assert row["ops"] == 2 and row["floor_us"] > 0, kind
        assert row["ratio"] > 0.8, (kind, row)  # no kernel runs far under its floor
    total = result["total"]
    assert total["kernels"] > 20 * 2
    assert total["unlabelled_us"] < 0.05 * total["kernel_us"], total
    assert all(r["us"] > 0 for r in result["kernels"])
    del model
    torch.cuda.empty_cache()


def test_the_cli_writes_the_result_file(tmp_path, monkeypatch):
    out = tmp_path / "account.json"
    argv = ["account", "--model", "qwen_dlm", "--layers", "2", "--context", "256"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out), "--git-revision", "test"])
    benchmark("rounds.account").main()
    got = json.loads(out.read_text())
    assert got["benchmark"] == "round_account" and got["git_revision"] == "test"
    assert got["device"] == torch.cuda.get_device_name()
    assert got["total"]["kernels"] == len(got["kernels"]) > 0
    assert {"kind", "us", "floor_us", "excess_us", "ratio"} <= set(got["kinds"][0])
