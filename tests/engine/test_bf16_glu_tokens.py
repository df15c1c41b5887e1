"""DLMRT_BF16_GLU=on gives DLMRT_BF16_GLU=off's tokens: on the CPU (the one-kernel object is
installed in every dense MLP and runs its twin) and on CUDA in block_graph fp32 (the kernel runs
at the block rows, the GEMM in full fp32 as cuBLAS's, so only summation order differs).

Run the GPU case on the device machine: pytest -m gpu tests/engine/test_bf16_glu_tokens.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM
from dlmrt.impls.dense import FusedGateUp, StackedGateUp

PROMPTS = tuple([(37 * i + 11) % 256 for i in range(n)] for n in (9, 22))
WIDE = dict(vocab_size=512, hidden_size=256, intermediate_size=512, head_dim=64)  # TMA rows


def _run(monkeypatch, path, pin: str, rule: str = "threshold", **how) -> tuple[list, list]:
    """(each prompt's tokens, each dense layer's gate_up implementation) with DLMRT_BF16_GLU=pin."""
    monkeypatch.setenv("DLMRT_BF16_GLU", pin)
    llm = LLM(path, **how)
    kw = dict(rule=rule, max_new_tokens=16, ignore_eos=True)  # the block's rows
    kw |= {"threshold": 0.25} if rule == "threshold" else {}
    tokens = [llm.generate(list(p), **kw).token_ids for p in PROMPTS]
    mlps = [layer.mlp for layer in llm.model.model.layers]
    return tokens, [m.gate_up for m in mlps if hasattr(m, "gate_up")]


def test_cpu_tokens_are_unchanged_with_the_pin_on(monkeypatch, tmp_path):
    path = write_checkpoint(tmp_path / "q", residual=residual_config())
    off, off_impls = _run(monkeypatch, path, "off", device="cpu")
    on, on_impls = _run(monkeypatch, path, "on", device="cpu")
    assert all(isinstance(g, StackedGateUp) for g in off_impls)
    assert on_impls and all(isinstance(g, FusedGateUp) and g.plan is None for g in on_impls)
    assert on == off


def test_llada2_dense_layers_take_it_on_the_cpu(monkeypatch, tmp_path):
    path = write_llada2_checkpoint(tmp_path / "l", vocab_size=512)
    off, _ = _run(monkeypatch, path, "off", "llada_editing", device="cpu")
    on, impls = _run(monkeypatch, path, "on", "llada_editing", device="cpu")
    assert len(impls) == 1 and isinstance(impls[0], FusedGateUp)  # first_k_dense_replace = 1
    assert on == off


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_block_graph_fp32_tokens_on_vs_off(monkeypatch, tmp_path):
    import dlmrt._kernels.fp8_glu_gemm as glu_kernel

    weights = []  # the weight of each kernel call: the model's, or the start-up measurement's
    run = glu_kernel.glu_gemm
    monkeypatch.setattr(
        glu_kernel,
        "glu_gemm",
        lambda a, w, *r, **k: weights.append(w.data_ptr()) or run(a, w, *r, **k),
    )
    monkeypatch.setenv("DLMRT_FA4", "off")
    monkeypatch.setenv("DLMRT_DEEPGEMM", "off")
    path = write_checkpoint(tmp_path / "q", residual=residual_config(), **WIDE)
    how = dict(device="cuda", dtype="float32", mode="block_graph")
    off, _ = _run(monkeypatch, path, "off", **how)
    assert not weights
    on, impls = _run(monkeypatch, path, "on", **how)
    assert impls and all(isinstance(g, FusedGateUp) and g.plan is not None for g in impls)
    ran = {g.weight.data_ptr() for g in impls} & set(weights)
    assert ran, "the kernel never ran on the model's weights: the plan's rows are not the rounds'"
    assert on == off
