"""Bad FP8 checkpoints: each a CheckpointError naming the tensor and the file (or the config field)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import write_checkpoint, write_llada2_checkpoint
from safetensors.torch import load_file, save_file

from dlmrt.errors import CheckpointError
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.loading.quant_config import read_quant_config
from dlmrt.quant.writer import write_fp8_checkpoint

CPU = torch.device("cpu")
Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fp8bad")
    return write_fp8_checkpoint(write_checkpoint(root / "src"), root / "fp8")


def _broken(fp8_dir: Path, tmp_path: Path, edit) -> Path:
    """A copy of the FP8 checkpoint with `edit(tensors, config)` applied."""
    out = tmp_path / "bad"
    out.mkdir()
    for f in fp8_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    edit(tensors, cfg)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _raises(path: Path, *fragments: str) -> None:
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, torch.float32, CPU)
    for fragment in fragments:
        assert fragment in str(e.value), (fragment, str(e.value))


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e5m2, torch.bfloat16])
def test_wrong_weight_dtype(fp8_dir, tmp_path, dtype):
    def edit(t, cfg):
        t[Q] = t[Q].float().to(dtype)

    path = _broken(fp8_dir, tmp_path, edit)
    _raises(
        path,
        str(path / "model.safetensors"),
        f"'{Q}' has dtype",
        "expected float8_e4m3fn",
        f"'{Q}_scale'",
    )


def test_missing_scale(fp8_dir, tmp_path):
    path = _broken(fp8_dir, tmp_path, lambda t, cfg: t.pop(Q + "_scale"))
    _raises(path, str(path / "model.safetensors"), f"FP8 tensor '{Q}' has no scale")


@pytest.mark.parametrize("shape", [(64, 2), (63,), (2, 64, 1)])
def test_scale_of_the_wrong_shape(fp8_dir, tmp_path, shape):
    def edit(t, cfg):
        t[Q + "_scale"] = torch.ones(shape)

    path = _broken(fp8_dir, tmp_path, edit)
    _raises(
        path,
        str(path / "model.safetensors"),
        f"scale '{Q}_scale' has shape {list(shape)}",
        f"for the FP8 weight '{Q}' of shape [64, 64]",
    )


def test_scale_of_the_wrong_dtype(fp8_dir, tmp_path):
    def edit(t, cfg):
        t[Q + "_scale"] = torch.ones(64, 1, dtype=torch.int32)

    path = _broken(fp8_dir, tmp_path, edit)
    _raises(path, str(path / "model.safetensors"), f"scale '{Q}_scale' has dtype int32")


def test_fp8_tensor_in_the_ignore_list(fp8_dir, tmp_path):
    def edit(t, cfg):
        cfg["quantization_config"]["ignore"].append("re:.*layers\\.0\\.self_attn\\.q_proj")

    path = _broken(fp8_dir, tmp_path, edit)
    _raises(path, str(path / "model.safetensors"), f"'{Q}' is FP8 but its module is in the ignore")


def test_fp8_tensor_without_a_quantization_config(fp8_dir, tmp_path):
    def edit(t, cfg):
        del cfg["quantization_config"]
        for name in [n for n in t if n.endswith("_scale")]:
            del t[name]

    path = _broken(fp8_dir, tmp_path, edit)
    _raises(
        path,
        str(path / "model.safetensors"),
        "has dtype float8_e4m3fn but the checkpoint declares no quantization",
    )


def test_stacked_experts_all_or_none_fp8(tmp_path):
    src = write_llada2_checkpoint(tmp_path / "src")
    fp8 = write_fp8_checkpoint(src, tmp_path / "fp8")
    expert = "model.layers.1.mlp.experts.3.gate_proj.weight"

    def edit(t, cfg):
        t[expert] = load_file(str(src / "model.safetensors"))[expert]
        del t[expert + "_scale"]

    _raises(_broken(fp8, tmp_path, edit), "model.layers.1.mlp.experts.gate_proj: 7 of its 8")


def _ct(weights: dict, **top) -> dict:
    return {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"g": {"weights": weights}},
            **top,
        }
    }


FP8_W = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}


@pytest.mark.parametrize(
    "raw, message",
    [
        (_ct({**FP8_W, "strategy": "group"}), "unsupported strategy 'group'"),
        (_ct({**FP8_W, "strategy": "block"}), "'g.weights.block_structure' must be two positive"),
        (_ct({**FP8_W, "type": "int", "num_bits": 4}), "'int' 4-bit weights are not FP8"),
        (_ct({**FP8_W, "symmetric": False}), "asymmetric FP8"),
        (_ct(FP8_W, format="pack-quantized"), "unsupported compressed-tensors format"),
        (_ct(FP8_W, ignore="lm_head"), "'ignore' must be a list of module names"),
        (
            {"quantization_config": {"quant_method": "gptq", "bits": 4}},
            "unsupported quantization_config.quant_method 'gptq'",
        ),
        (
            {"quantization_config": {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}},
            "unsupported ModelOpt quant_algo 'W4A8_AWQ'",
        ),
    ],
)
def test_unsupported_schemes_are_refused(tmp_path, raw, message):
    with pytest.raises(CheckpointError, match=re.escape(message)) as e:
        read_quant_config(tmp_path, raw)
    assert str(tmp_path / "config.json") in str(e.value)


def test_quant_config_detection(tmp_path):
    assert read_quant_config(tmp_path, {}) is None
    ct = read_quant_config(tmp_path, _ct({**FP8_W, "strategy": "tensor"}, ignore=["lm_head"]))
    assert (ct.method, ct.strategy, ct.ignore) == ("compressed-tensors", "tensor", ("lm_head",))
    new = {
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "FP8",
            "ignore": ["lm_head"],
            "kv_cache_quant_algo": "FP8",
        }
    }
    mo = read_quant_config(tmp_path, new)
    assert (mo.method, mo.strategy, mo.ignore, mo.kv_cache) == (
        "modelopt",
        "tensor",
        ("lm_head",),
        "FP8",
    )
    legacy = {
        "producer": {"name": "modelopt"},
        "quantization": {
            "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN",
            "exclude_modules": ["*router*"],
        },
    }
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(legacy))
    mo = read_quant_config(tmp_path, {})
    assert (mo.method, mo.strategy, mo.ignore) == ("modelopt", "channel", ("*router*",))
    assert mo.source == tmp_path / "hf_quant_config.json"
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"producer": {}}))
    with pytest.raises(CheckpointError, match="hf_quant_config.json: missing the 'quantization'"):
        read_quant_config(tmp_path, {})
