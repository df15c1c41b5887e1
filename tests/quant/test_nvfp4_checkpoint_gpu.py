"""GPU: NVFP4 checkpoints (both layouts) load onto CUDA with their routed experts on the W4A16
kernel (`experts.impl`: `Nvfp4Experts`) or converted to FP8 W8A8, and decode the same tokens in the three modes (LLaDA2, DiffusionGemma).

Run on the device machine: pytest -m gpu tests/quant/test_nvfp4_checkpoint_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_modes_agree
from nvfp4_helpers import nvfp4_sources

from dlmrt import LLM
from dlmrt.impls.experts import W8A8Experts
from dlmrt.models.experts import Experts
from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")


@pytest.mark.parametrize("experts_path", ["w4a16", "fp8"])
@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
@pytest.mark.parametrize("family", ["llada2", "dg"])
def test_nvfp4_checkpoint_on_cuda_modes_agree(tmp_path, monkeypatch, family, fmt, experts_path):
    """Both ways NVFP4 experts run on Hopper: the W4A16 kernel, or converted at load to FP8 W8A8."""
    monkeypatch.setenv("DLMRT_NVFP4_EXPERTS", experts_path)
    src = nvfp4_sources(tmp_path / "src")[family]
    path = write_nvfp4_checkpoint(src, tmp_path / "nvfp4", fmt=fmt)
    llms = {m: LLM(path, device="cuda", mode=m) for m in MODES}
    experts = [m for m in llms["eager"].model.modules() if isinstance(m, Experts)]
    if experts_path == "w4a16":
        assert experts[0].impl.stacks[0].packed.is_cuda  # installed for the kernel
    else:  # per-channel FP8 codes on the W8A8 kernel, within FP8 rounding of the NVFP4 values
        e = experts[0]
        assert isinstance(e.impl, W8A8Experts) and e.down_proj.dtype == torch.float8_e4m3fn
        deq = e.down_proj.float() * e.impl.scales[2].unsqueeze(-1)
        name = next(n for n, m in llms["eager"].model.named_modules() if m is e)
        want = LLM(path, device="cuda", quantization="none").model.get_submodule(name).down_proj
        err = (deq - want.float()).norm() / want.float().norm()
        assert 0 < err < 0.05, err
    vocab = 96 if family == "dg" else 256
    prompt = [(37 * i + 11) % (vocab - 6) + 6 for i in range(9)]
    # DiffusionGemma's eager default draws from torch's generator (the oracle's noise): the
    # counter RNG makes all three modes draw the same noise
    kw = {"rng": "counter"} if family == "dg" else {}
    outs = {
        m: llm.generate(prompt, max_new_tokens=16, ignore_eos=True, **kw) for m, llm in llms.items()
    }
    assert_modes_agree(outs, family, fmt)
    plain = LLM(path, device="cuda", mode="eager", quantization="none")  # dequantized bf16
    assert not any(getattr(m, "nvfp4", None) is not None for m in plain.model.modules())


@pytest.mark.parametrize("family", ["llada2", "dg"])
def test_w4a4_emulation_on_cuda_modes_agree_and_match_the_cpu_twin(tmp_path, family):
    """activations="nvfp4": the quantize-dequantize of the expert inputs is captured in the
    graphs (the three modes agree) and the kernel path's layer equals the CPU twin's closely."""
    import torch as t

    src = nvfp4_sources(tmp_path / "src")[family]
    amax = lambda name: t.tensor(3.0)  # noqa: E731
    path = write_nvfp4_checkpoint(src, tmp_path / "w4a4", input_amax=amax)
    llms = {m: LLM(path, device="cuda", mode=m, activations="nvfp4") for m in MODES}
    vocab = 96 if family == "dg" else 256
    prompt = [(31 * i + 7) % (vocab - 6) + 6 for i in range(9)]
    kw = {"rng": "counter"} if family == "dg" else {}
    outs = {
        m: llm.generate(prompt, max_new_tokens=16, ignore_eos=True, **kw) for m, llm in llms.items()
    }
    assert_modes_agree(outs, family, "w4a4")
    cpu = LLM(path, device="cpu", dtype="float32", mode="eager", activations="nvfp4")
    gpu = LLM(path, device="cuda", dtype="float32", mode="eager", activations="nvfp4")
    pick = lambda llm: next(  # noqa: E731
        m for m in llm.model.modules() if getattr(getattr(m, "impl", None), "act_scales", None)
    )
    a, b = pick(cpu), pick(gpu)
    x = t.randn(6, a.impl.stacks[2].shape[1])  # down [E, H, I]: the hidden size
    weights, index = t.rand(6, 2), t.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2], [1, 3]])
    want = a(x, weights, index)
    got = b(x.cuda(), weights.cuda(), index.cuda()).cpu()
    assert (got - want).norm() < 1e-2 * want.norm()
