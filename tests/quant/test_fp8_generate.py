"""CPU generation with an FP8 checkpoint: the same tokens as the bf16 checkpoint built from the
dequantized weights (each family); the CLI flags reach `LLM`; the CUDA hand-off to `use_quantized`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint
from safetensors.torch import load_file, save_file

from dlmrt import LLM
from dlmrt.formats.fp8 import Fp8Weight, quantize_per_channel
from dlmrt.loading import placement
from dlmrt.loading.policy import classify
from dlmrt.quant.per_tensor import quantize_per_tensor
from dlmrt.quant.writer import write_fp8_checkpoint

QUANTIZE = {"channel": quantize_per_channel, "tensor": quantize_per_tensor}


def _dequantized_copy(src: Path, out: Path, strategy: str) -> Path:
    """`src` with every FP8 candidate replaced by its quantize -> dequantize, stored unquantized."""
    out.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    for name, t in tensors.items():
        if classify(name)[0] and t.dim() in (2, 3):
            tensors[name] = QUANTIZE[strategy](t).dequantize(t.dtype).contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    return out


def _sources(tmp_path: Path, family: str) -> Path:
    if family == "qwen":
        return write_checkpoint(tmp_path / "src", residual=residual_config())
    if family == "llada2":
        return write_llada2_checkpoint(tmp_path / "src")
    import dg_helpers
    from dg_helpers import save_checkpoint

    torch.manual_seed(0)
    hf = dg_helpers.dg.DiffusionGemmaForBlockDiffusion(dg_helpers._config()).eval()
    dg_helpers._randomise(hf, 1)
    return save_checkpoint(hf, tmp_path / "src")


@pytest.mark.parametrize(
    "family, fmt, strategy, dtype",
    [("qwen", "compressed-tensors", "channel", "float32"),
     ("qwen", "modelopt", "tensor", "bfloat16"),
     ("llada2", "modelopt", "channel", "float32"),
     ("dg", "compressed-tensors", "channel", "float32")],
)  # fmt: skip
def test_fp8_checkpoint_generates_the_dequantized_checkpoints_tokens(
    tmp_path, family, fmt, strategy, dtype
):
    src = _sources(tmp_path, family)
    fp8 = write_fp8_checkpoint(src, tmp_path / "fp8", fmt=fmt, strategy=strategy)
    deq = _dequantized_copy(src, tmp_path / "deq", strategy)
    prompt = [7, 11, 13, 17, 19, 23]
    kw = dict(max_new_tokens=8, ignore_eos=True, seed=3)
    if family == "dg":  # a short canvas schedule: CPU time
        from dg_helpers import SETTINGS

        kw.update(SETTINGS[0])
    kv = "fp8_e4m3" if family == "dg" else "auto"  # DiffusionGemma over the FP8 context arena
    llms = [LLM(p, dtype=dtype, device="cpu", kv_cache_dtype=kv) for p in (fp8, deq)]
    assert llms[0].engine.kv_dtype == (torch.float8_e4m3fn if kv != "auto" else llms[0].dtype)
    outs = [llm.generate(prompt, **kw) for llm in llms]
    assert outs[0].token_ids == outs[1].token_ids
    assert len(outs[0].token_ids) == kw["max_new_tokens"]
    assert outs[0].rounds_per_block == outs[1].rounds_per_block


def test_quantization_fp8_at_load_generates_like_the_per_channel_checkpoint(tmp_path):
    src = write_checkpoint(tmp_path / "src")
    deq = _dequantized_copy(src, tmp_path / "deq", "channel")
    prompt, kw = [5, 6, 7, 8], dict(max_new_tokens=8, ignore_eos=True)
    llm = LLM(src, dtype="float32", device="cpu", quantization="fp8", kv_cache_dtype="fp8")
    assert llm.engine.kv_dtype == torch.float8_e4m3fn  # the FP8 arena: the engine's half
    at_load = llm.generate(prompt, **kw)
    ref = LLM(deq, dtype="float32", device="cpu", kv_cache_dtype="fp8").generate(prompt, **kw)
    assert at_load.token_ids == ref.token_ids


def test_bad_engine_values_list_the_choices(tmp_path):
    src = write_checkpoint(tmp_path / "src")
    with pytest.raises(ValueError, match="quantization: expected one of none, fp8, got 'fp4'"):
        LLM(src, device="cpu", quantization="fp4")
    with pytest.raises(ValueError, match="kv_cache_dtype: expected one of auto, fp8, fp8_e4m3"):
        LLM(src, device="cpu", kv_cache_dtype="int8")


def test_startup_log_says_what_is_fp8_and_why_not(tmp_path, caplog):
    src = write_checkpoint(tmp_path / "src", residual=residual_config())
    fp8 = write_fp8_checkpoint(src, tmp_path / "fp8", ignore=["lm_head"])
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        LLM(fp8, dtype="float32", device="cpu")
    text = caplog.text
    assert "14 FP8 candidate(s): cpu: dequantized to float32 at load" in text
    assert "1 FP8 candidate(s): in the checkpoint's ignore list ('lm_head')" in text
    assert "ORL residual adapter" in text


class _Fp8Model(torch.nn.Module):
    """Two linears; `use_quantized` takes `a` and declines `b` (as a model without a kernel for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 4, bias=False), torch.nn.Linear(8, 4, bias=False)
        self.taken: dict[str, Fp8Weight] = {}

    def use_quantized(self, fp8: dict[str, Fp8Weight], **how: bool | str) -> list[str]:
        self.taken = {n: w for n, w in fp8.items() if n == "a.weight"}
        with torch.no_grad():
            self.b.weight.zero_()  # a model that frees what it declines is re-filled
        return [n for n in fp8 if n != "a.weight"]


def test_place_quantized_hands_weights_to_use_quantized_and_dequantizes_the_declined(
    monkeypatch, caplog
):
    model = _Fp8Model()
    fp8 = {n: quantize_per_channel(p) for n, p in model.state_dict().items()}
    monkeypatch.setattr(placement, "has_quantized_kernels", lambda device: True)
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        running = placement.place_quantized(model, fp8, {}, torch.device("cpu"))
    assert set(running) == {"a.weight"} and set(model.taken) == {"a.weight"}
    assert torch.equal(model.b.weight, fp8["b.weight"].dequantize(torch.float32))
    assert "quantized weights: 1 tensor(s)" in caplog.text
    assert "kept by the model" in caplog.text


@pytest.mark.parametrize("family", ["qwen", "llada2"])
def test_fp8_checkpoint_through_use_fp8_equals_installing_the_quantized_model(
    tmp_path, monkeypatch, family
):
    """The CUDA hand-off, run on the CPU twins: an FP8 checkpoint loaded through `use_quantized` decodes
    like the bf16 model with its weights quantized and installed directly (`fp8_helpers`)."""
    from fp8_helpers import quantize_model

    monkeypatch.setenv("DLMRT_FP8_GEMMS", "all")
    monkeypatch.setattr(placement, "has_quantized_kernels", lambda device: True)
    src = _sources(tmp_path, family)
    loaded = LLM(write_fp8_checkpoint(src, tmp_path / "fp8"), dtype="float32", device="cpu")
    direct = LLM(src, dtype="float32", device="cpu")
    quantize_model(direct.engine.model)
    assert any(type(m).__name__ == "Fp8Linear" for m in loaded.model.modules())
    prompt, kw = [5, 6, 7, 8, 9], dict(max_new_tokens=8, ignore_eos=True)
    assert loaded.generate(prompt, **kw).token_ids == direct.generate(prompt, **kw).token_ids
