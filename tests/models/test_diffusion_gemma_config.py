"""DiffusionGemma config.json as each transformers version writes it (JSON written here, so the
test does not depend on the installed version): `per_layer_config` keys in any spelling."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dlmrt.errors import CheckpointError
from dlmrt.models.diffusion_gemma_config import diffusion_gemma_config_from_hf

S, F = "sliding_attention", "full_attention"
LAYERS = [S, S, S, S, S, F, S, S, S, S, S, F]  # full layers 5 and 11, as in the issue
FULL_OVERRIDE = {"head_dim": 512, "num_key_value_heads": 2}


def _config(per_layer_config: dict) -> dict:
    text = {
        "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 12,
        "num_attention_heads": 4, "num_key_value_heads": 8, "head_dim": 256, "sliding_window": 5,
        "layer_types": LAYERS, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 12,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "use_bidirectional_attention": "vision",
        "rope_parameters": {
            S: {"rope_type": "default", "rope_theta": 10000.0},
            F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        },
        "per_layer_config": per_layer_config,
    }  # fmt: skip
    cfg = {"architectures": ["DiffusionGemmaForBlockDiffusion"], "canvas_length": 8}
    return {**cfg, "text_config": text, "eos_token_id": 1}


def _parse(raw_json: str, tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text(raw_json)
    return diffusion_gemma_config_from_hf(json.loads(path.read_text()), path)


# transformers 5.17 zero-pads the keys to the width of the last layer index; 5.24 does not.
V5_17 = '{"05": {"head_dim": 512, "num_key_value_heads": 2}, "11": {"head_dim": 512, "num_key_value_heads": 2}}'
V5_24 = '{"5": {"head_dim": 512, "num_key_value_heads": 2}, "11": {"head_dim": 512, "num_key_value_heads": 2}}'


@pytest.mark.parametrize(
    "per_layer", [V5_17, V5_24], ids=["transformers-5.17", "transformers-5.24"]
)
def test_per_layer_keys_in_any_spelling(per_layer, tmp_path):
    raw = json.dumps(_config({})).replace(
        '"per_layer_config": {}', f'"per_layer_config": {per_layer}'
    )
    cfg = _parse(raw, tmp_path)
    assert cfg.head_dims == tuple(512 if k == F else 256 for k in LAYERS)
    assert cfg.kv_heads == tuple(2 if k == F else 8 for k in LAYERS)


def test_a_full_layer_without_override_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"full_attention layer\(s\) \[11\]"):
        _parse(json.dumps(_config({"05": FULL_OVERRIDE})), tmp_path)


@pytest.mark.parametrize(
    "per_layer, message",
    [
        ({"five": FULL_OVERRIDE}, "key 'five' is not a layer index"),
        ({"5": FULL_OVERRIDE, "05": FULL_OVERRIDE, "11": FULL_OVERRIDE}, "layer 5 is given twice"),
        ({"5": FULL_OVERRIDE, "11": FULL_OVERRIDE, "12": {}}, r"layer '12' is outside \[0, 12\)"),
    ],
)
def test_bad_per_layer_keys_are_named(per_layer, message, tmp_path):
    with pytest.raises(CheckpointError, match=message):
        _parse(json.dumps(_config(per_layer)), tmp_path)


DG_SIZES = [
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "sliding_window", "num_experts", "top_k_experts",
    "moe_intermediate_size", "max_position_embeddings",
]  # fmt: skip


def _full_layers() -> dict:
    return {"5": FULL_OVERRIDE, "11": FULL_OVERRIDE}


@pytest.mark.parametrize("value", [0, -2])
@pytest.mark.parametrize("field", DG_SIZES)
def test_non_positive_text_config_size_is_named(field, value, tmp_path):
    cfg = _config(_full_layers())
    cfg["text_config"][field] = value
    message = f"config.json: config field 'text_config.{field}' = {value} must be >= 1"
    with pytest.raises(CheckpointError, match=re.escape(message)):
        _parse(json.dumps(cfg), tmp_path)


@pytest.mark.parametrize("key", ["head_dim", "num_key_value_heads"])
def test_non_positive_per_layer_size_is_named(key, tmp_path):
    cfg = _config({"5": FULL_OVERRIDE, "11": {**FULL_OVERRIDE, key: 0}})
    with pytest.raises(CheckpointError, match=f"'text_config.{key} of layer 11' = 0"):
        _parse(json.dumps(cfg), tmp_path)


def test_non_positive_canvas_length_is_named(tmp_path):
    cfg = {**_config(_full_layers()), "canvas_length": 0}
    with pytest.raises(CheckpointError, match="config field 'canvas_length' = 0 must be >= 1"):
        _parse(json.dumps(cfg), tmp_path)


@pytest.mark.parametrize("eos", [96, [1, 200], -1])
def test_stop_id_outside_the_vocabulary_is_named(eos, tmp_path):
    cfg = {**_config(_full_layers()), "eos_token_id": eos}
    with pytest.raises(
        CheckpointError, match=r"'eos_token_id' \[.*\] is not a token id in \[0, 96\)"
    ):
        _parse(json.dumps(cfg), tmp_path)
