"""Config values and tensor dtypes checked at load: sizes >= 1, stop ids in the vocabulary, float
weights stored as floats; each error names the field (or tensor) and the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, write_checkpoint, write_llada2_checkpoint
from safetensors.torch import load_file, save_file

from dlmrt.errors import CheckpointError
from dlmrt.loading.checkpoint import load_checkpoint

CPU = torch.device("cpu")
SIZES = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "block_size",
]


def _edit(path: Path, name: str, **fields: object) -> Path:
    cfg = json.loads((path / name).read_text()) if (path / name).is_file() else {}
    cfg.update(fields)
    (path / name).write_text(json.dumps(cfg))
    return path


def _load(path: Path) -> None:
    load_checkpoint(path, torch.float32, CPU)


@pytest.fixture(scope="module", params=["qwen", "llada2"])
def family_ckpt(request, tmp_path_factory) -> Path:
    """A pristine checkpoint of each family; tests copy it before editing."""
    out = tmp_path_factory.mktemp(request.param) / "m"
    return write_checkpoint(out) if request.param == "qwen" else write_llada2_checkpoint(out)


def _copy(src: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "m"
    dest.mkdir()
    for f in src.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


@pytest.mark.parametrize("value", [0, -4])
@pytest.mark.parametrize("field", SIZES)
def test_non_positive_size_is_named(family_ckpt, tmp_path, field, value) -> None:
    path = _edit(_copy(family_ckpt, tmp_path), "config.json", **{field: value})
    cfg = path / "config.json"
    with pytest.raises(CheckpointError, match=re.escape(f"{cfg}: config field '{field}' = ")):
        _load(path)


def test_heads_not_a_multiple_of_kv_heads(family_ckpt, tmp_path) -> None:
    path = _edit(_copy(family_ckpt, tmp_path), "config.json", num_key_value_heads=3)
    with pytest.raises(CheckpointError, match="'num_attention_heads' = 4 is not a multiple"):
        _load(path)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
@pytest.mark.parametrize("eos", [VOCAB, [2, VOCAB + 5], -1])
def test_stop_id_outside_the_vocabulary_is_named(family_ckpt, tmp_path, name, eos) -> None:
    path = _edit(_copy(family_ckpt, tmp_path), name, eos_token_id=eos)
    pattern = re.escape(f"{path / name}: 'eos_token_id' [") + ".*" + re.escape(f"[0, {VOCAB})")
    with pytest.raises(CheckpointError, match=pattern):
        _load(path)


def test_stop_ids_inside_the_vocabulary_load(family_ckpt, tmp_path) -> None:
    path = _edit(
        _copy(family_ckpt, tmp_path), "generation_config.json", eos_token_id=[0, VOCAB - 1]
    )
    _load(path)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_tensor_for_a_float_weight_is_named(family_ckpt, tmp_path, dtype) -> None:
    path = _copy(family_ckpt, tmp_path)
    weights = load_file(str(path / "model.safetensors"))
    name = "model.norm.weight"
    weights[name] = torch.ones_like(weights[name], dtype=dtype)
    save_file(weights, str(path / "model.safetensors"))
    short = str(dtype).removeprefix("torch.")
    message = f"{path / 'model.safetensors'}: tensor '{name}' has dtype {short}, expected a float"
    with pytest.raises(CheckpointError, match=re.escape(message)):
        _load(path)


def test_float16_weights_still_load(family_ckpt, tmp_path) -> None:
    path = _copy(family_ckpt, tmp_path)
    weights = load_file(str(path / "model.safetensors"))
    save_file({k: v.half() for k, v in weights.items()}, str(path / "model.safetensors"))
    _load(path)


def test_integer_expert_slice_is_named(tmp_path) -> None:
    """LLaDA2's per-expert tensors fill slices of one stacked parameter: checked the same way."""
    path = write_llada2_checkpoint(tmp_path / "m")
    weights = load_file(str(path / "model.safetensors"))
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    weights[name] = weights[name].to(torch.int64)
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=re.escape(f"tensor '{name}' has dtype int64")):
        _load(path)
