"""NVFP4 checkpoints: quantize -> write each format -> load -> the same dequantized weights, for the
three families; what is NVFP4 and what is not; the installed experts give the dequantized model's
outputs; each malformed checkpoint -> a CheckpointError naming the tensor or the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from nvfp4_helpers import nvfp4_sources
from safetensors.torch import load_file, save_file

from dlmrt.errors import CheckpointError
from dlmrt.formats.nvfp4 import Nvfp4Weight, quantize_nvfp4
from dlmrt.impls.experts import Nvfp4Experts
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.loading.quant_config import read_quant_config
from dlmrt.quant.nvfp4_writer import is_nvfp4_target, write_nvfp4_checkpoint

CPU = torch.device("cpu")
FORMATS = ["modelopt", "compressed-tensors"]
UP = "model.layers.0.mlp.up_proj.weight"  # LLaDA2's dense first layer


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    return nvfp4_sources(tmp_path_factory.mktemp("nvfp4src"))


def _fits(t: torch.Tensor) -> bool:
    return t.dim() in (2, 3) and t.shape[-1] % 16 == 0


@pytest.mark.parametrize("family", ["qwen", "llada2", "dg"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_gives_the_same_dequantized_weights(sources, tmp_path, family, fmt):
    ref = load_checkpoint(sources[family], torch.float32, CPU).model.state_dict()
    out = write_nvfp4_checkpoint(sources[family], tmp_path / "q", fmt=fmt)
    ckpt = load_checkpoint(out, torch.float32, CPU)
    expected = {n for n in ref if is_nvfp4_target(n) and _fits(ref[n])}
    assert set(ckpt.quantized) == expected and expected
    assert all(isinstance(w, Nvfp4Weight) for w in ckpt.quantized.values())
    assert not any("shared_experts" in n or "self_attn" in n for n in ckpt.quantized)
    # compressed-tensors stores 1 / global scale: its inverse is 1 ulp off at most
    tol = {} if fmt == "modelopt" else {"rtol": 3e-7, "atol": 0}
    for name, tensor in ckpt.model.state_dict().items():
        want = (
            quantize_nvfp4(ref[name]).dequantize(torch.float32) if name in expected else ref[name]
        )
        if tol and name in expected:
            torch.testing.assert_close(tensor, want, **tol)
        else:
            assert torch.equal(tensor, want), name
    for name, w in ckpt.quantized.items():  # the kept codes are the reference's codes
        q = quantize_nvfp4(ref[name])
        assert torch.equal(w.packed, q.packed), name
        assert torch.equal(w.block_scale.view(torch.uint8), q.block_scale.view(torch.uint8)), name


def test_writer_records_the_scheme_and_is_detected(sources, tmp_path):
    mo = write_nvfp4_checkpoint(sources["llada2"], tmp_path / "mo")
    hf = json.loads((mo / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quant_algo"] == "NVFP4" and hf["group_size"] == 16
    assert "model.layers.1.mlp.gate" in hf["exclude_modules"]  # a router
    assert "model.layers.0.attention.query_key_value" in hf["exclude_modules"]
    tensors = load_file(str(mo / "model.safetensors"))
    name = "model.layers.1.mlp.experts.3.gate_proj.weight"
    assert tensors[name].dtype == torch.uint8 and tensors[name].shape[-1] == 32
    assert tensors[name + "_scale"].dtype == torch.float8_e4m3fn
    assert tensors[name + "_scale_2"].shape == ()
    ct = write_nvfp4_checkpoint(sources["dg"], tmp_path / "ct", fmt="compressed-tensors")
    qcfg = read_quant_config(ct, json.loads((ct / "config.json").read_text()))
    assert (qcfg.method, qcfg.scheme, qcfg.strategy) == ("compressed-tensors", "nvfp4", "group")
    tensors = load_file(str(ct / "model.safetensors"))
    stacked = next(n for n in tensors if n.endswith("experts.gate_up_proj_packed"))
    assert tensors[stacked.replace("_packed", "_global_scale")].dim() == 1  # one per expert


@pytest.mark.parametrize("family", ["llada2", "dg"])
def test_installed_nvfp4_experts_give_the_dequantized_outputs(sources, tmp_path, family):
    """use_quantized with the NVFP4 weights (as on CUDA): the experts run `ops.moe_mlp_nvfp4`, the dense
    MLPs `Nvfp4Linear`s (tests/quant/test_nvfp4_dense.py)."""
    out = write_nvfp4_checkpoint(sources[family], tmp_path / "q")
    plain = load_checkpoint(out, torch.float32, CPU)
    inst = load_checkpoint(out, torch.float32, CPU)
    left = inst.model.use_quantized(dict(inst.quantized))
    experts = [
        m for m in inst.model.modules() if isinstance(getattr(m, "impl", None), Nvfp4Experts)
    ]
    assert len(experts) == {"llada2": 2, "dg": 5}[family]
    assert all(n not in left for n in inst.quantized if ".experts." in n)
    assert not left  # the dense MLPs' gate, up and down are all NVFP4: installed too
    x = torch.randn(6, plain.config.hidden_size)
    weights = torch.rand(6, 2)
    index = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2], [1, 3]])
    for a, b in zip(experts, [m for m in plain.model.modules() if type(m) is type(experts[0])]):
        torch.testing.assert_close(a(x, weights, index), b(x, weights, index), rtol=1e-5, atol=1e-5)


def _broken(src: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "bad"
    out.mkdir(parents=True)
    for f in src.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(out / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def nvfp4_dirs(sources, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nvfp4bad")
    return {f: write_nvfp4_checkpoint(sources["llada2"], root / f, fmt=f) for f in FORMATS}


def _names(fmt: str) -> tuple[str, str, str]:
    if fmt == "modelopt":
        return UP, UP + "_scale", UP + "_scale_2"
    return UP + "_packed", UP + "_scale", UP + "_global_scale"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("what", ["block", "global"])
def test_missing_scale(nvfp4_dirs, tmp_path, fmt, what):
    packed, block, glob = _names(fmt)
    gone = block if what == "block" else glob
    path = _broken(nvfp4_dirs[fmt], tmp_path, lambda t: t.pop(gone))
    kind = "block scale" if what == "block" else "global scale"
    with pytest.raises(
        CheckpointError, match=f"'{packed}' has no {kind} \\(expected a tensor '{gone}'"
    ):
        load_checkpoint(path, torch.float32, CPU)


@pytest.mark.parametrize("fmt", FORMATS)
def test_wrong_packed_shape_dtype_and_scale_shape(nvfp4_dirs, tmp_path, fmt):
    packed, block, glob = _names(fmt)
    cases = [
        (lambda t: t.__setitem__(packed, t[packed][:, :-1].contiguous()), "block scale"),
        (lambda t: t.__setitem__(packed, t[packed].to(torch.int16)), "expected uint8"),
        (lambda t: t.__setitem__(block, t[block].float()), "expected float8_e4m3fn"),
        (lambda t: t.__setitem__(glob, torch.ones(3)), "global scale"),
    ]
    for i, (edit, message) in enumerate(cases):
        path = _broken(nvfp4_dirs[fmt], tmp_path / str(i), edit)
        with pytest.raises(CheckpointError, match=message) as e:
            load_checkpoint(path, torch.float32, CPU)
        assert str(path / "model.safetensors") in str(e.value)


def test_a_packed_tensor_without_scales_and_an_ignored_nvfp4_module(nvfp4_dirs, tmp_path):
    path = _broken(
        nvfp4_dirs["modelopt"],
        tmp_path / "a",
        lambda t: t.__setitem__(
            "model.layers.0.attention.dense.weight", torch.zeros(64, 64, dtype=torch.uint8)
        ),
    )
    with pytest.raises(CheckpointError, match="dense.weight' has dtype uint8 but no NVFP4 block"):
        load_checkpoint(path, torch.float32, CPU)
    path = _broken(nvfp4_dirs["modelopt"], tmp_path / "b", lambda t: None)
    hf = json.loads((path / "hf_quant_config.json").read_text())
    hf["quantization"]["exclude_modules"].append("model.layers.0.mlp.up_proj")
    (path / "hf_quant_config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match="is NVFP4 but its module is in the ignore list"):
        load_checkpoint(path, torch.float32, CPU)


@pytest.mark.parametrize("raw, message", [
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}},
     "NVFP4 group_size 32 is not supported"),
    ({"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "group_size": 16,
                                          "strategy": "tensor_group"}}}}}, "are not NVFP4"),
    ({"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float", "group_size": 32,
                                          "strategy": "group"}}}}}, "strategy 'group' group_size 32"),
])  # fmt: skip
def test_unsupported_nvfp4_configs(tmp_path, raw, message):
    with pytest.raises(CheckpointError, match=message):
        read_quant_config(tmp_path, raw)


def test_declared_fp8_kv_cache_is_a_hint_only(sources, tmp_path, caplog):
    """kv_cache_quant_algo "FP8": "auto" keeps the compute-dtype arena (as vLLM), logs the hint;
    kv_cache_dtype="fp8" runs the FP8 arena."""
    from dlmrt import LLM

    out = write_nvfp4_checkpoint(sources["llada2"], tmp_path / "q")
    hf = json.loads((out / "hf_quant_config.json").read_text())
    assert LLM(out, device="cpu").engine.kv_dtype != torch.float8_e4m3fn
    hf["quantization"]["kv_cache_quant_algo"] = "FP8"
    (out / "hf_quant_config.json").write_text(json.dumps(hf))
    with caplog.at_level("INFO", logger="dlmrt"):
        assert LLM(out, device="cpu").engine.kv_dtype != torch.float8_e4m3fn
    assert "declares an FP8 KV cache" in caplog.text
    assert LLM(out, device="cpu", kv_cache_dtype="fp8").engine.kv_dtype == torch.float8_e4m3fn
