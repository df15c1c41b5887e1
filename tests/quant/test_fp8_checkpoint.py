"""FP8 checkpoints: quantize -> save in each format -> load -> the same dequantized weights, for the
three families; ignore lists honoured; quantization="fp8" at load; quantization="none"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fp8_helpers import fp8_sources

from dlmrt.formats.fp8 import Fp8Weight, quantize_per_channel
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.loading.policy import classify
from dlmrt.quant.per_tensor import quantize_per_tensor
from dlmrt.quant.writer import write_fp8_checkpoint

CPU = torch.device("cpu")
FORMATS = [
    ("compressed-tensors", "channel"),
    ("compressed-tensors", "tensor"),
    ("modelopt", "channel"),
    ("modelopt", "tensor"),
]
QUANTIZE = {"channel": quantize_per_channel, "tensor": quantize_per_tensor}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    return fp8_sources(tmp_path_factory, "fp8src")


def _expected(ref: dict[str, torch.Tensor], fp8: dict[str, Fp8Weight], strategy: str):
    """The reference weights after this scheme's quantize -> dequantize (FP8 ones only)."""
    return {n: QUANTIZE[strategy](ref[n]).dequantize(ref[n].dtype) for n in fp8}


@pytest.mark.parametrize("family", ["qwen", "llada2", "dg"])
@pytest.mark.parametrize("fmt, strategy", FORMATS)
def test_round_trip_gives_the_same_dequantized_weights(sources, tmp_path, family, fmt, strategy):
    src = sources[family]
    ref = load_checkpoint(src, torch.float32, CPU).model.state_dict()
    out = write_fp8_checkpoint(src, tmp_path / "fp8", fmt=fmt, strategy=strategy)
    ckpt = load_checkpoint(out, torch.float32, CPU)
    got = ckpt.model.state_dict()
    # every candidate the model holds untied is FP8, nothing else is
    tied = {n for n in ref if n == "lm_head.weight" and family == "dg"}  # DG ties its head
    assert set(ckpt.quantized) == {n for n in ref if classify(n)[0]} - tied
    # qwen: 2 layers x (q, k, v, o, gate, up, down) + lm_head; llada2: layer 0 dense (qkv, dense,
    # 3 mlp), 2 MoE layers (qkv, dense, 3 stacked experts, 3 shared) + lm_head; dg: 3 sliding
    # (q, k, v, o, 3 mlp, 2 experts) + 2 full layers (no v_proj), head tied
    assert len(ckpt.quantized) == {"qwen": 15, "llada2": 22, "dg": 43}[family]
    expected = _expected(ref, ckpt.quantized, strategy)
    for name, tensor in got.items():
        assert torch.equal(tensor, expected.get(name, ref[name])), name
    for name, w in ckpt.quantized.items():  # the kept FP8 weights are the quantized reference
        q = QUANTIZE[strategy](ref[name])
        assert torch.equal(w.qweight.view(torch.uint8), q.qweight.view(torch.uint8)), name
        assert torch.equal(w.scale, q.scale), name


def test_writer_records_the_scheme_and_the_unquantized_linears(sources, tmp_path):
    ct = write_fp8_checkpoint(sources["llada2"], tmp_path / "ct", ignore=["lm_head"])
    qc = json.loads((ct / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "float-quantized"
    assert qc["config_groups"]["group_0"]["weights"]["strategy"] == "channel"
    assert "lm_head" in qc["ignore"] and "model.layers.1.mlp.gate" in qc["ignore"]  # a router
    mo = write_fp8_checkpoint(sources["qwen"], tmp_path / "mo", fmt="modelopt", strategy="tensor")
    hf = json.loads((mo / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quant_algo"] == "FP8"
    assert "model.residual_adapter.gate_proj" in hf["exclude_modules"]


@pytest.mark.parametrize("fmt", ["compressed-tensors", "modelopt"])
def test_ignore_list_keeps_those_modules_unquantized(sources, tmp_path, fmt):
    src = sources["qwen"]
    ignore = ["lm_head", "re:.*layers\\.1\\.self_attn\\..*", "model.layers.0.mlp.down_proj"]
    if fmt == "modelopt":
        ignore[1] = "*layers.1.self_attn.*"
    out = write_fp8_checkpoint(src, tmp_path / "fp8", fmt=fmt, ignore=ignore)
    ref = load_checkpoint(src, torch.float32, CPU).model.state_dict()
    # quantization="fp8" quantizes the stored-bf16 candidates, but never those the list names
    for quantization in (None, "fp8"):
        ckpt = load_checkpoint(out, torch.float32, CPU, quantization=quantization)
        kept = [n for n in ref if classify(n)[0] and n not in ckpt.quantized]
        assert sorted(kept) == sorted(
            ["lm_head.weight", "model.layers.0.mlp.down_proj.weight"]
            + [f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkvo"]
        )
        for name in kept:
            assert torch.equal(ckpt.model.state_dict()[name], ref[name]), name


def test_quantization_fp8_at_load_equals_a_per_channel_checkpoint(sources, tmp_path):
    """LLM(DIR, quantization="fp8"): the same weights as the written per-channel FP8 checkpoint."""
    for family in ("qwen", "llada2", "dg"):
        at_load = load_checkpoint(sources[family], torch.float32, CPU, quantization="fp8")
        stored = load_checkpoint(
            write_fp8_checkpoint(sources[family], tmp_path / family), torch.float32, CPU
        )
        assert set(at_load.quantized) == set(stored.quantized)
        a, b = at_load.model.state_dict(), stored.model.state_dict()
        assert all(torch.equal(a[n], b[n]) for n in a)


def test_quantization_none_runs_an_fp8_checkpoint_dequantized(sources, tmp_path):
    out = write_fp8_checkpoint(sources["qwen"], tmp_path / "fp8")
    auto = load_checkpoint(out, torch.float32, CPU)
    none = load_checkpoint(out, torch.float32, CPU, quantization="none")
    assert auto.quantized and not none.quantized
    a, b = auto.model.state_dict(), none.model.state_dict()
    assert all(torch.equal(a[n], b[n]) for n in a)
    with pytest.raises(ValueError, match="quantization: expected one of none, fp8, got 'int4'"):
        load_checkpoint(out, torch.float32, CPU, quantization="int4")


def test_a_plain_checkpoint_has_no_fp8_weights(sources, tmp_path):
    assert load_checkpoint(sources["qwen"], torch.float32, CPU).quantized == {}
    fp8 = write_fp8_checkpoint(sources["qwen"], tmp_path / "fp8")
    with pytest.raises(ValueError, match="already quantized \\(compressed-tensors, config.json\\)"):
        write_fp8_checkpoint(fp8, tmp_path / "twice")


def test_sharded_fp8_checkpoint(sources, tmp_path):
    """Scales listed in the index with their weights; a weight and its scale load across shards."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "sharded"
    src.mkdir()
    for f in sources["qwen"].iterdir():
        if f.suffix != ".safetensors":
            (src / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(sources["qwen"] / "model.safetensors"))
    names = sorted(tensors)
    halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(src / file))
    index = {"weight_map": {n: f for f, part in halves.items() for n in part}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    out = write_fp8_checkpoint(src, tmp_path / "fp8")
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert weight_map["lm_head.weight_scale"] == weight_map["lm_head.weight"]
    ckpt = load_checkpoint(out, torch.float32, CPU)
    assert "lm_head.weight" in ckpt.quantized


def test_a_stored_fp8_router_is_dequantized_not_run_in_fp8(sources, tmp_path):
    """The policy holds for FP8 checkpoints too: an FP8-stored router loads dequantized."""
    from safetensors.torch import load_file, save_file

    out = write_fp8_checkpoint(sources["llada2"], tmp_path / "fp8")
    tensors = load_file(str(out / "model.safetensors"))
    router = "model.layers.1.mlp.gate.weight"
    q = quantize_per_channel(tensors[router])
    tensors[router], tensors[router + "_scale"] = q.qweight, q.scale
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["ignore"].remove("model.layers.1.mlp.gate")
    (out / "config.json").write_text(json.dumps(cfg))
    ckpt = load_checkpoint(out, torch.float32, CPU)
    assert router not in ckpt.quantized
    assert torch.equal(ckpt.model.state_dict()[router], q.dequantize(torch.float32))
