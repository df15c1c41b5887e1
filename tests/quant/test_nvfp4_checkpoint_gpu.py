"""GPU: NVFP4 checkpoints (both layouts) load onto CUDA with their routed experts on the W4A16
kernel (`experts.nvfp4`) and decode the same tokens in the three modes (LLaDA2, DiffusionGemma).

Run on the device machine: pytest -m gpu tests/quant/test_nvfp4_checkpoint_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_modes_agree
from nvfp4_helpers import nvfp4_sources

from dlmrt import LLM
from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")


@pytest.mark.parametrize("fmt", ["modelopt", "compressed-tensors"])
@pytest.mark.parametrize("family", ["llada2", "dg"])
def test_nvfp4_checkpoint_on_cuda_modes_agree(tmp_path, family, fmt):
    src = nvfp4_sources(tmp_path / "src")[family]
    path = write_nvfp4_checkpoint(src, tmp_path / "nvfp4", fmt=fmt)
    llms = {m: LLM(path, device="cuda", mode=m) for m in MODES}
    experts = [m for m in llms["eager"].model.modules() if getattr(m, "nvfp4", None) is not None]
    assert experts and experts[0].nvfp4[0].packed.is_cuda  # installed for the kernel
    vocab = 96 if family == "dg" else 256
    prompt = [(37 * i + 11) % (vocab - 6) + 6 for i in range(9)]
    # DiffusionGemma's eager default draws from torch's generator (the oracle's noise): the
    # counter RNG makes all three modes draw the same noise
    kw = {"rng": "counter"} if family == "dg" else {}
    outs = {m: llm.generate(prompt, max_new_tokens=16, ignore_eos=True, **kw)
            for m, llm in llms.items()}  # fmt: skip
    assert_modes_agree(outs, family, fmt)
    plain = LLM(path, device="cuda", mode="eager", quantization="none")  # dequantized bf16
    assert not any(getattr(m, "nvfp4", None) is not None for m in plain.model.modules())
