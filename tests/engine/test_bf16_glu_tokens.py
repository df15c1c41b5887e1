"""DLMRT_BF16_GLU=on gives DLMRT_BF16_GLU=off's tokens: on the CPU (the one-kernel object is
installed in every dense MLP and runs its twin) and on CUDA in block_graph fp32 (the kernel runs
at the block rows, the GEMM in full fp32 as cuBLAS's, so only summation order differs).

Run the GPU case on the device machine: pytest -m gpu tests/engine/test_bf16_glu_tokens.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint

from dlmrt import LLM
from dlmrt.impls.dense import FusedGateUp, StackedGateUp

PROMPTS = tuple([(37 * i + 11) % 256 for i in range(n)] for n in (9, 22))
WIDE = dict(vocab_size=512, hidden_size=256, intermediate_size=512, head_dim=64)  # TMA rows


def _run(monkeypatch, path, pin: str, **how) -> tuple[list, list]:
    """(each prompt's tokens, each layer's gate_up implementation) with DLMRT_BF16_GLU=pin."""
    monkeypatch.setenv("DLMRT_BF16_GLU", pin)
    llm = LLM(path, **how)
    kw = dict(rule="threshold", threshold=0.25, max_new_tokens=16, ignore_eos=True)  # block rows
    tokens = [llm.generate(list(p), **kw).token_ids for p in PROMPTS]
    return tokens, [layer.mlp.gate_up for layer in llm.model.model.layers]


def test_cpu_tokens_are_unchanged_with_the_pin_on(monkeypatch, tmp_path):
    path = write_checkpoint(tmp_path / "q", residual=residual_config())
    off, off_impls = _run(monkeypatch, path, "off", device="cpu")
    on, on_impls = _run(monkeypatch, path, "on", device="cpu")
    assert all(isinstance(g, StackedGateUp) for g in off_impls)
    assert on_impls and all(isinstance(g, FusedGateUp) and g.plan is None for g in on_impls)
    assert on == off


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_block_graph_fp32_tokens_on_vs_off(monkeypatch, tmp_path):
    import dlmrt._kernels.fp8_glu_gemm as glu_kernel

    calls = []
    run = glu_kernel.glu_gemm
    monkeypatch.setattr(glu_kernel, "glu_gemm", lambda *a, **k: calls.append(1) or run(*a, **k))
    monkeypatch.setenv("DLMRT_FA4", "off")
    monkeypatch.setenv("DLMRT_DEEPGEMM", "off")
    path = write_checkpoint(tmp_path / "q", residual=residual_config(), **WIDE)
    how = dict(device="cuda", dtype="float32", mode="block_graph")
    off, _ = _run(monkeypatch, path, "off", **how)
    assert not calls
    on, impls = _run(monkeypatch, path, "on", **how)
    assert all(isinstance(g, FusedGateUp) and g.plan is not None for g in impls)
    assert calls, "the kernel never ran: the plan's rows are not the rounds' rows"
    assert on == off
