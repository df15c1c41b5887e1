"""GPU: dense NVFP4 MLPs (QwenDLM, LLaDA2's dense first layer, DiffusionGemma's GeGLU) run on the
dense W4A16 kernel (`Nvfp4Linear`, kernels/linear_nvfp4.py): installed on CUDA, the execution modes
decode the same tokens, and a layer's output is the twin's (dequantize, then F.linear) within
rounding; W4A4 emulation likewise.

Run on the device machine: pytest -m gpu tests/quant/test_nvfp4_dense_gpu.py
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_modes_agree
from nvfp4_helpers import nvfp4_sources

from dlmrt import LLM
from dlmrt.impls.nvfp4_linear import Nvfp4Linear
from dlmrt.models.layers import GeGLU, SwiGLU
from dlmrt.ops import reference
from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
FAMILIES = ["qwen", "llada2", "dg"]


def _dense(llm: LLM) -> list[torch.nn.Module]:
    """The layers' dense MLPs (not LLaDA2's shared experts, also a SwiGLU)."""
    return [layer.mlp for layer in llm.model.model.layers if type(layer.mlp) in (SwiGLU, GeGLU)]


def _generate(llms: dict[str, LLM], family: str, seed: int) -> dict:
    vocab = 96 if family == "dg" else 256
    prompt = [(seed * i + 11) % (vocab - 6) + 6 for i in range(9)]
    # DiffusionGemma's eager default draws from torch's generator: the counter RNG makes all
    # modes draw the same noise
    kw = {"rng": "counter"} if family == "dg" else {}
    return {
        m: llm.generate(prompt, max_new_tokens=16, ignore_eos=True, **kw) for m, llm in llms.items()
    }


def _twin(mlp, x: torch.Tensor) -> torch.Tensor:
    """The dense MLP from the twins: dequantized gate|up, the activation, dequantized down."""
    h = F.linear(x, mlp.gate_up.linear.weight.dequantize(x.dtype))
    if type(mlp) is GeGLU:
        gate, up = h.chunk(2, dim=-1)
        act = F.gelu(gate, approximate="tanh") * up
    else:
        act = reference.silu_mul(h)
    return F.linear(act, mlp.down_proj.weight.dequantize(x.dtype))


@pytest.mark.parametrize("family", FAMILIES)
def test_dense_nvfp4_mlps_run_the_kernel_and_modes_agree(tmp_path, caplog, monkeypatch, family):
    monkeypatch.setenv("DLMRT_NVFP4_DENSE", "kernel")  # not the measured choice: the kernel's test
    path = write_nvfp4_checkpoint(nvfp4_sources(tmp_path / "src")[family], tmp_path / "q")
    with caplog.at_level(logging.DEBUG, logger="dlmrt"):  # per-layer lines are debug
        llms = {m: LLM(path, device="cuda", mode=m) for m in MODES}
    assert "nvfp4 model.layers.0.mlp: NVFP4 weight-only W4A16 (dense MLP)" in caplog.text
    assert "W4A16 kernel (DLMRT_NVFP4_DENSE=kernel)" in caplog.text  # the choice, logged once
    mlps = _dense(llms["eager"])
    assert mlps and all(isinstance(m.gate_up.linear, Nvfp4Linear) for m in mlps)
    assert all(m.gate_up.linear.packed.is_cuda and m.gate_up.linear.act_scale is None for m in mlps)
    assert_modes_agree(_generate(llms, family, 37), family, "w4a16")
    mlp = mlps[0]
    for rows in (1, 16, 100):  # the kernel's BM 16 and 64 tiles
        x = torch.randn(rows, mlp.gate_up.linear.weight.shape[1], device="cuda").bfloat16()
        got, want = mlp(x).float(), _twin(mlp, x).float()
        assert (got - want).norm() < 1e-2 * want.norm()  # the same weights; sums rounded apart
    gpu = LLM(path, device="cuda", dtype="float32", mode="eager")
    cpu = LLM(path, device="cpu", dtype="float32", mode="eager")  # dequantized at load
    a, b = _dense(gpu)[0], _dense(cpu)[0]
    assert isinstance(a.down_proj, Nvfp4Linear) and type(b.down_proj) is torch.nn.Linear
    x = torch.randn(24, a.gate_up.linear.weight.shape[1])
    want = b(x)
    torch.testing.assert_close(
        a(x.cuda()).cpu(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item()
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_dense_w4a4_emulation_on_cuda_modes_agree_and_match_the_cpu_twin(tmp_path, family):
    """activations="nvfp4": the quantize-dequantize of the dense MLPs' inputs is captured in the
    graphs (the modes agree) and the kernel path's layer equals the CPU twin's closely."""
    amax = lambda name: torch.tensor(3.0)  # noqa: E731
    src = nvfp4_sources(tmp_path / "src")[family]
    path = write_nvfp4_checkpoint(src, tmp_path / "w4a4", input_amax=amax)
    llms = {m: LLM(path, device="cuda", mode=m, activations="nvfp4") for m in MODES}
    assert all(m.gate_up.linear.act_scale is not None for m in _dense(llms["eager"]))
    assert_modes_agree(_generate(llms, family, 31), family, "w4a4")
    cpu = LLM(path, device="cpu", dtype="float32", mode="eager", activations="nvfp4")
    gpu = LLM(path, device="cuda", dtype="float32", mode="eager", activations="nvfp4")
    a, b = _dense(cpu)[0], _dense(gpu)[0]
    x = torch.randn(6, a.gate_up.linear.weight.shape[1])
    want, got = a(x), b(x.cuda()).cpu()
    # an input within rounding of an E2M1 midpoint may land on either side: compare norms
    assert (got - want).norm() < 1e-2 * want.norm()
