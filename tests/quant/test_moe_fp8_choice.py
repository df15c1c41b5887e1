"""How FP8 and NVFP4 routed experts run (`dlmrt/ops/moe_fp8_choice.py`): the policies
(DLMRT_FP8_EXPERTS, DLMRT_NVFP4_EXPERTS), the measured choice (timings faked: the GPU measures
them), and the installer's W8A8 flag on a CPU model. CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import write_llada2_checkpoint

from dlmrt import LLM
from dlmrt.impls.experts import W8A8Experts
from dlmrt.loading import placement
from dlmrt.models.experts import Experts
from dlmrt.ops import moe_fp8_choice


def _w8a8_flags(model) -> set[bool]:
    """Per FP8 experts module (one holding codes' scales): whether it runs W8A8."""
    impls = [
        m.impl
        for m in model.modules()
        if getattr(getattr(m, "impl", None), "scales", None) is not None
    ]
    return {isinstance(impl, W8A8Experts) for impl in impls}


class _CudaTensor:
    """Stands for a CUDA weight: the choice reads only its device and shape."""

    device, is_cuda, shape = torch.device("cuda"), True, (8, 64, 32)


def _w8a8(rows=256):
    return moe_fp8_choice.use_w8a8(rows, 8, (None, None), _CudaTensor(), (), "silu")


def _as_fp8(rows=256):
    return moe_fp8_choice.use_fp8_for_nvfp4(rows, 8, (), (None, _CudaTensor(), ()), "silu")


@pytest.mark.parametrize("policy, want", [("w8a8", True), ("w8a16", False)])
def test_the_fp8_policy_overrides_the_measurement(monkeypatch, policy, want):
    monkeypatch.setenv("DLMRT_FP8_EXPERTS", policy)
    monkeypatch.setattr(moe_fp8_choice, "measure", lambda *a: pytest.fail("measured"))
    assert _w8a8() == (want, f"DLMRT_FP8_EXPERTS={policy}")


@pytest.mark.parametrize("times, want", [((200.0, 150.0), True), ((150.0, 200.0), False)])
def test_measured_keeps_the_faster_expert_kernel(monkeypatch, times, want):
    monkeypatch.delenv("DLMRT_FP8_EXPERTS", raising=False)
    monkeypatch.setattr(moe_fp8_choice, "measure", lambda *a: times)
    ok, why = _w8a8()
    assert ok is want and why == f"256 rows: W8A16 {times[0]:.1f} us, W8A8 {times[1]:.1f} us"


@pytest.mark.parametrize("times, want", [((300.0, 240.0), True), ((100.0, 240.0), False)])
def test_nvfp4_experts_convert_to_fp8_only_where_faster(monkeypatch, times, want):
    monkeypatch.delenv("DLMRT_NVFP4_EXPERTS", raising=False)
    key = ("nvfp4", 32, 8, 8, 64, 32, "silu")
    monkeypatch.setitem(moe_fp8_choice._MEASURED, key, times)
    ok, why = _as_fp8(32)
    assert ok is want and f"NVFP4 W4A16 {times[0]:.1f} us, as FP8 W8A8 {times[1]:.1f} us" in why


@pytest.mark.parametrize("policy, want", [("fp8", True), ("w4a16", False)])
def test_the_nvfp4_policy_overrides_the_measurement(monkeypatch, policy, want):
    monkeypatch.setenv("DLMRT_NVFP4_EXPERTS", policy)
    assert _as_fp8() == (want, f"DLMRT_NVFP4_EXPERTS={policy}")


@pytest.mark.parametrize("var", ["DLMRT_FP8_EXPERTS", "DLMRT_NVFP4_EXPERTS"])
def test_a_bad_policy_names_the_variable(monkeypatch, var):
    monkeypatch.setenv(var, "sometimes")
    with pytest.raises(ValueError, match=f"{var}='sometimes'"):
        _w8a8() if var == "DLMRT_FP8_EXPERTS" else _as_fp8()


def test_the_cpu_runs_the_w8a8_twin_and_w8a16_on_request(tmp_path, monkeypatch):
    """An FP8 LLaDA2 installed on the CPU as on CUDA (the CPU otherwise dequantizes at load): W8A8
    experts by default (their twin); forced weight-only, other numerics (activations not
    quantized)."""
    monkeypatch.setattr(placement, "has_quantized_kernels", lambda device: True)  # as on CUDA
    path = write_llada2_checkpoint(tmp_path / "l", vocab_size=512)
    outs, flags = {}, {}
    for policy in ("measured", "w8a16"):
        monkeypatch.setenv("DLMRT_FP8_EXPERTS", policy)
        llm = LLM(path, quantization="fp8", dtype=torch.bfloat16)  # W8A8 serves half models
        flags[policy] = _w8a8_flags(llm.model)
        experts = [m for m in llm.model.modules() if isinstance(m, Experts)]
        hidden = experts[0].down_proj.shape[1]
        x = torch.randn(5, hidden, generator=torch.Generator().manual_seed(0)).bfloat16()
        weights = torch.full((5, 2), 0.5)
        index = torch.tensor([[0, 1]] * 5)
        outs[policy] = experts[0](x, weights, index).float()
    assert flags == {"measured": {True}, "w8a16": {False}}
    assert not torch.equal(outs["measured"], outs["w8a16"])
    rel = (outs["measured"] - outs["w8a16"]).norm() / outs["w8a16"].norm()
    assert rel < 0.1  # e4m3 activations: a few percent (seen 5.1%), not a different function


def test_an_fp32_model_keeps_weight_only_experts(tmp_path, monkeypatch):
    """The W8A8 kernel rounds as a half model does; an fp32 model keeps W8A16 (even forced)."""
    monkeypatch.setattr(placement, "has_quantized_kernels", lambda device: True)
    monkeypatch.setenv("DLMRT_FP8_EXPERTS", "w8a8")
    path = write_llada2_checkpoint(tmp_path / "l", vocab_size=512)
    llm = LLM(path, quantization="fp8", dtype=torch.float32)
    flags = _w8a8_flags(llm.model)
    assert flags == {False}
