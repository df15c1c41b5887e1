"""Whether a dense NVFP4 MLP runs the W4A16 kernel or is dequantized (`dlmrt/ops/nvfp4_choice.py`):
the policy (DLMRT_NVFP4_DENSE), the measured choice (timings faked: the GPU measures them), and the
installer honouring it, except under the W4A4 emulation. CPU."""

from __future__ import annotations

import logging

import pytest
import torch
from nvfp4_helpers import nvfp4_sources

from dlmrt import LLM
from dlmrt.impls import dense_install
from dlmrt.impls.nvfp4_linear import Nvfp4Linear
from dlmrt.loading import placement
from dlmrt.ops import nvfp4_choice
from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint

CUDA = torch.device("cuda")  # never touched: `measure` is faked
PROMPT, KW = [5, 6, 7, 8, 9], dict(max_new_tokens=8, ignore_eos=True)


@pytest.mark.parametrize("policy, want", [("kernel", True), ("dequantize", False)])
def test_the_policy_overrides_the_measurement(monkeypatch, policy, want):
    monkeypatch.setenv("DLMRT_NVFP4_DENSE", policy)
    monkeypatch.setattr(nvfp4_choice, "measure", lambda *a: pytest.fail("measured"))
    assert nvfp4_choice.use_nvfp4_dense(256, [(64, 32)], CUDA) == (
        want,
        f"DLMRT_NVFP4_DENSE={policy}",
    )


def test_a_bad_policy_names_the_variable(monkeypatch):
    monkeypatch.setenv("DLMRT_NVFP4_DENSE", "sometimes")
    with pytest.raises(ValueError, match="DLMRT_NVFP4_DENSE='sometimes'"):
        nvfp4_choice.use_nvfp4_dense(256, [(64, 32)], CUDA)


@pytest.mark.parametrize("kernel_us, want", [((3.0, 4.0), True), ((3.0, 9.0), False)])
def test_measured_keeps_the_faster_summed_over_the_mlps_gemms(monkeypatch, kernel_us, want):
    """gate|up [2I, H] and down [H, I]: bf16 5 + 5 us against the kernel's two times."""
    monkeypatch.delenv("DLMRT_NVFP4_DENSE", raising=False)
    times = {(256, 64, 32): (5.0, kernel_us[0]), (256, 32, 32): (5.0, kernel_us[1])}
    monkeypatch.setattr(nvfp4_choice, "measure", lambda rows, n, k, dev: times[(rows, n, k)])
    ok, why = nvfp4_choice.use_nvfp4_dense(256, [(64, 32), (32, 32)], CUDA)
    assert ok is want and "bf16 10.0 us" in why and f"{sum(kernel_us):.1f} us" in why


def test_the_cpu_installs_it(monkeypatch):
    monkeypatch.setattr(nvfp4_choice, "measure", lambda *a: pytest.fail("measured"))
    assert nvfp4_choice.use_nvfp4_dense(16, [(64, 32)], torch.device("cpu")) == (True, "CPU")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvfp4choice")
    amax = lambda name: torch.tensor(2.0)  # noqa: E731
    return write_nvfp4_checkpoint(nvfp4_sources(root / "src")["qwen"], root / "q", input_amax=amax)


def test_a_slower_kernel_leaves_the_mlp_dequantized_but_emulation_installs_it(
    qwen, monkeypatch, caplog
):
    monkeypatch.setattr(placement, "has_quantized_kernels", lambda device: True)  # as on CUDA
    monkeypatch.setattr(dense_install, "use_nvfp4_dense", lambda *a: (False, "bf16 faster"))
    with caplog.at_level(logging.DEBUG, logger="dlmrt"):
        declined = LLM(qwen, device="cpu", dtype="float32", mode="eager")
    assert "nvfp4 model.layers.0.mlp: dequantized (bf16 faster)" in caplog.text
    assert not any(isinstance(m, Nvfp4Linear) for m in declined.model.modules())
    plain = LLM(qwen, device="cpu", dtype="float32", mode="eager", quantization="none")
    got = declined.generate(PROMPT, **KW).token_ids
    assert got == plain.generate(PROMPT, **KW).token_ids  # the same dequantized weights
    monkeypatch.setattr(dense_install, "use_nvfp4_dense", lambda *a: pytest.fail("consulted"))
    emulated = LLM(qwen, device="cpu", dtype="float32", mode="eager", activations="nvfp4")
    assert sum(isinstance(m, Nvfp4Linear) for m in emulated.model.modules()) == 4  # 2 layers
