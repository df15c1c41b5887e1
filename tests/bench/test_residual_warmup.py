"""The offline residual warm-up pilot (`benchmarks/residual_warmup.py`) on the embedded demo model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from test_benchmark_helpers import _load

from dlmrt import LLM
from dlmrt.demo import demo_model_path


def test_warmup_trains_only_the_adapter_and_writes_an_orl_checkpoint(tmp_path: Path):
    out = tmp_path / "warm"
    _load("residual_warmup").main([
        "--model", str(demo_model_path()), "--out", str(out), "--task", "arithmetic",
        "--steps", "3", "--rows", "512", "--lr", "0", "--adapter-lr", "1e-2", "--tau", "0.9999",
    ])  # fmt: skip
    first = json.loads((out / "warmup_log.jsonl").read_text().splitlines()[0])
    # a fresh adapter has a zero output projection: z changes nothing before the first update
    assert first["ce1"] == first["ce1_without_z"] and 0 < first["accepted"] <= 1
    base = load_file(str(demo_model_path() / "model.safetensors"))
    warm = load_file(str(out / "model.safetensors"))
    adapter = [n for n in warm if "residual_adapter" in n]
    assert adapter and all(n in warm for n in base)
    for name, t in base.items():  # --lr 0: the backbone is frozen
        assert torch.equal(warm[name].to(t.dtype), t), name
    assert warm["model.residual_adapter.down_proj.weight"].abs().sum() > 0  # the adapter learned
    llm = LLM(str(out), role="orl", device="cpu")
    assert llm.model.adapter is not None
    assert llm.generate("What is 2 + 3?", max_new_tokens=16).token_ids
