"""GPU: FP8 checkpoints (both formats) load onto CUDA through `use_quantized` and decode the same tokens
in the three modes; the CUDA result of an FP8 checkpoint equals that of the bf16 checkpoint of its
dequantized weights run through quantization="fp8" (same codes and scales).

Run on the device machine: pytest -m gpu tests/quant/test_fp8_checkpoint_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_modes_agree, residual_config, write_checkpoint, write_llada2_checkpoint
from safetensors.torch import load_file, save_file

from dlmrt import LLM
from dlmrt.formats.fp8 import FP8, quantize_per_channel
from dlmrt.impls.fp8_linear import Fp8Linear
from dlmrt.loading.policy import classify
from dlmrt.quant.writer import write_fp8_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
WIDE = dict(vocab_size=512, hidden_size=256, intermediate_size=512, head_dim=64)


def _source(root, family: str):
    if family == "qwen-orl":
        return write_checkpoint(root / "src", residual=residual_config(), **WIDE)
    return write_llada2_checkpoint(root / "src", vocab_size=512)


def _bf16_dequantized(src, out):
    """`src` with every candidate replaced by e4m3 codes times a power-of-two row scale, stored in
    bf16 (exact: 4 significant bits). Each row's largest code is 448, so quantizing it again (at
    load, or by the writer) gives back the same codes and scales."""
    out.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    for name, t in tensors.items():
        if classify(name)[0] and t.dim() in (2, 3):
            q = quantize_per_channel(t)
            scale = torch.exp2(torch.log2(q.scale).round())
            t = q.qweight.float() * scale[..., None]
        tensors[name] = t.to(torch.bfloat16).contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize("fmt", ["compressed-tensors", "modelopt"])
@pytest.mark.parametrize("family", ["qwen-orl", "llada"])
def test_fp8_checkpoint_on_cuda_modes_agree(tmp_path, monkeypatch, family, fmt):
    monkeypatch.setenv("DLMRT_FP8_GEMMS", "all")  # tiny shapes would measure bf16 faster
    path = write_fp8_checkpoint(_source(tmp_path, family), tmp_path / "fp8", fmt=fmt)
    llms = {m: LLM(path, device="cuda", mode=m) for m in MODES}
    model = llms["eager"].model
    assert any(isinstance(m, Fp8Linear) for m in model.modules())  # use_quantized installed them
    if family == "llada":
        assert model.model.layers[1].mlp.experts.gate_proj.dtype == FP8
    prompt = [(37 * i + 11) % 256 for i in range(9)]
    outs = {m: llm.generate(prompt, max_new_tokens=29, ignore_eos=True) for m, llm in llms.items()}
    assert_modes_agree(outs, family, fmt)


@pytest.mark.parametrize("family", ["qwen-orl", "llada"])
def test_fp8_checkpoint_equals_quantize_at_load_of_its_dequantized_weights(
    tmp_path, monkeypatch, family
):
    monkeypatch.setenv("DLMRT_FP8_GEMMS", "all")
    deq = _bf16_dequantized(_source(tmp_path, family), tmp_path / "deq")
    fp8 = write_fp8_checkpoint(deq, tmp_path / "fp8")  # re-quantizing bf16 codes*scale: exact
    a = LLM(fp8, device="cuda", mode="block_graph")
    b = LLM(deq, device="cuda", mode="block_graph", quantization="fp8")
    prompt = [(29 * i + 5) % 256 for i in range(11)]
    kw = dict(max_new_tokens=29, ignore_eos=True)
    assert a.generate(prompt, **kw).token_ids == b.generate(prompt, **kw).token_ids
