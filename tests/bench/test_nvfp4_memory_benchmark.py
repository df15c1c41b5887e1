"""benchmarks/rounds/nvfp4_memory.py and its random NVFP4 checkpoint on the CPU: the full-size config
is DiffusionGemma-26B's, the tiny checkpoint reads back as NVFP4 with weights of RMS about 0.02,
and the smoke run goes through the memory install when the kernels are faked (as on CUDA)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from benchmark_modules import benchmark

from dlmrt.formats.nvfp4 import Nvfp4Weight
from dlmrt.loading import placement
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.model_shapes import diffusion_gemma_26b
from dlmrt.models.diffusion_gemma_config import diffusion_gemma_config_from_hf


def test_the_full_size_config_is_diffusion_gemma_26b(tmp_path):
    raw = benchmark("random_nvfp4_checkpoint").hf_config(30, tiny=False)
    got = diffusion_gemma_config_from_hf(raw, tmp_path / "config.json")
    want = diffusion_gemma_26b()
    assert replace(got, max_position_embeddings=want.max_position_embeddings) == replace(
        want, eos_token_ids=got.eos_token_ids
    )


def test_the_tiny_checkpoint_reads_back_as_nvfp4(tmp_path):
    path = benchmark("random_nvfp4_checkpoint").write_random_nvfp4(tmp_path / "ck", 6, tiny=True)
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) == 7  # one file per layer, one for the rest
    ckpt = load_checkpoint(path, torch.float32, torch.device("cpu"))
    experts = [n for n in ckpt.quantized if n.endswith("experts.gate_up_proj")]
    assert len(experts) == 6 and all(isinstance(w, Nvfp4Weight) for w in ckpt.quantized.values())
    assert len(ckpt.quantized) == 6 * 5  # experts: gate|up, down; dense: gate, up, down
    rms = ckpt.model.state_dict()["model.layers.3.experts.down_proj"].pow(2).mean().sqrt()
    assert 0.015 < float(rms) < 0.025


def test_the_smoke_run_installs_what_each_preference_chooses(tmp_path, monkeypatch):
    monkeypatch.setattr(placement, "has_quantized_kernels", lambda device: True)  # as on CUDA
    argv = ["--tiny", "--device", "cpu", "--steps", "6", "--iters", "1"]
    out = benchmark("rounds.nvfp4_memory").main([*argv, "--out", str(tmp_path / "r.json")])
    runs = {r["prefer"]: r["runs"] for r in out["results"]}
    want = {"experts Nvfp4Experts": 6, "dense mlp QuantGateUp": 6}
    assert runs == {"memory": want, "speed": want}  # a float32 model keeps NVFP4 either way
    # a step time is a difference of two timings: on a loaded CPU with one iteration it can
    # come out negative, so only its presence is checked here (speed is measured on the GPU)
    assert all(math.isfinite(r["ms_per_step"]) for r in out["results"])
    assert json.loads((tmp_path / "r.json").read_text())["layers"] == 6


@pytest.mark.gpu
def test_the_tiny_run_on_cuda_keeps_memory_4bit_and_speed_as_measured(tmp_path):
    out = benchmark("rounds.nvfp4_memory").main(
        ["--tiny", "--steps", "6", "--iters", "1", "--out", str(tmp_path / "r.json")]
    )
    runs = {r["prefer"]: r["runs"] for r in out["results"]}
    assert runs["memory"] == {"experts Nvfp4Experts": 6, "dense mlp QuantGateUp": 6}
    speed = {k: v for k, v in runs["speed"].items() if k.startswith("experts")}
    assert sum(speed.values()) == 6 and set(speed) <= {
        "experts Nvfp4Experts",
        "experts W8A8Experts",
    }
    assert all(r["peak_gb"] >= r["allocated_after_load_gb"] > 0 for r in out["results"])
