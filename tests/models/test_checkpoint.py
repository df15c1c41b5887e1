"""load_checkpoint / resolve_model_path: strict loading, exact values, and errors naming file + field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import residual_config, write_checkpoint
from safetensors.torch import load_file, save_file

from dlmrt.errors import CheckpointError
from dlmrt.loading.checkpoint import load_checkpoint, resolve_model_path

CPU = torch.device("cpu")
WEIGHTS = "model.safetensors"
SHARD = "model-{:05d}-of-00002.safetensors"


def load(path: Path, dtype: torch.dtype = torch.float32):
    return load_checkpoint(path, dtype, CPU)


def edit_config(path: Path, fn: Callable[[dict[str, Any]], Any]) -> Path:
    cfg = json.loads((path / "config.json").read_text())
    fn(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def edit_weights(path: Path, fn: Callable[[dict[str, torch.Tensor]], Any]) -> Path:
    weights = load_file(str(path / WEIGHTS))
    fn(weights)
    save_file(weights, str(path / WEIGHTS))
    return path


def names(file: Path, *parts: str) -> str:
    """A regex matching the file path, then each part (escaped), in order."""
    return ".*".join(re.escape(s) for s in (str(file), *parts))


def shard(path: Path, split: Callable[[list[str]], tuple[list[str], list[str]]]) -> None:
    """Rewrite model.safetensors as two shards plus an index; `split` picks each shard's tensors."""
    weights = load_file(str(path / WEIGHTS))
    (path / WEIGHTS).unlink()
    weight_map = {}
    for i, keys in enumerate(split(sorted(weights)), 1):
        fname = SHARD.format(i)
        save_file({k: weights[k] for k in keys}, str(path / fname))
        weight_map.update({k: fname for k in keys if k not in weight_map})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


@pytest.mark.parametrize("residual", [None, residual_config()], ids=["base", "orl"])
def test_loaded_values_equal_file(tmp_path: Path, residual: dict | None) -> None:
    """Every model tensor equals the file's tensor of that name; eval mode, no grads, gen config."""
    path = write_checkpoint(tmp_path / "x", residual=residual)
    ckpt = load(path)
    assert ckpt.generation_config["eos_token_id"] == 256
    assert not ckpt.model.training
    assert not any(p.requires_grad for p in ckpt.model.parameters())
    state, file = ckpt.model.state_dict(), load_file(str(path / WEIGHTS))
    assert set(state) == set(file)
    for name, t in file.items():
        assert state[name].dtype == torch.float32
        assert torch.equal(state[name], t), name


def test_bfloat16_dtype(base_ckpt: Path) -> None:
    """dtype=bfloat16 gives bf16 parameters equal to the fp32 file values cast to bf16."""
    state = load(base_ckpt, torch.bfloat16).model.state_dict()
    for name, t in load_file(str(base_ckpt / WEIGHTS)).items():
        assert state[name].dtype == torch.bfloat16
        assert torch.equal(state[name], t.to(torch.bfloat16)), name


def test_tied_lm_head(tmp_path: Path) -> None:
    """tie_word_embeddings=True (no lm_head.weight in the file) shares the embedding tensor."""
    ckpt = write_checkpoint(tmp_path / "x", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(str(ckpt / WEIGHTS))
    model = load(ckpt).model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    embed = load_file(str(ckpt / WEIGHTS))["model.embed_tokens.weight"]
    assert torch.equal(model.lm_head.weight, embed)


def test_untied_lm_head(base_ckpt: Path) -> None:
    """An untied checkpoint loads a distinct lm_head equal to the file's lm_head.weight."""
    model = load(base_ckpt).model
    file = load_file(str(base_ckpt / WEIGHTS))
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.lm_head.weight, file["lm_head.weight"])
    assert not torch.equal(file["lm_head.weight"], file["model.embed_tokens.weight"])


def test_unstated_tie_without_lm_head_ties(base_ckpt: Path) -> None:
    """No tie_word_embeddings field and no lm_head.weight: the head is tied to the embeddings."""
    edit_config(base_ckpt, lambda c: c.pop("tie_word_embeddings"))
    edit_weights(base_ckpt, lambda w: w.pop("lm_head.weight"))
    model = load(base_ckpt).model
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_untied_config_missing_lm_head(base_ckpt: Path) -> None:
    """tie_word_embeddings false but no lm_head.weight is a missing-tensor error naming it."""
    edit_weights(base_ckpt, lambda w: w.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match=names(base_ckpt, "missing", "lm_head.weight")):
        load(base_ckpt)


def test_sharded_equals_single_file(base_ckpt: Path) -> None:
    """Two shards plus model.safetensors.index.json load exactly the single-file state_dict."""
    single = load(base_ckpt).model.state_dict()
    shard(base_ckpt, lambda keys: (keys[: len(keys) // 2], keys[len(keys) // 2 :]))
    assert not (base_ckpt / WEIGHTS).exists()
    sharded = load(base_ckpt).model.state_dict()
    assert set(sharded) == set(single)
    for name, t in single.items():
        assert torch.equal(sharded[name], t), name


def test_tensor_in_two_shards(base_ckpt: Path) -> None:
    """A tensor stored in two shards raises naming the tensor and both files."""
    shard(base_ckpt, lambda keys: (keys[1:], [keys[0], "model.norm.weight"]))
    first, second = base_ckpt / SHARD.format(1), base_ckpt / SHARD.format(2)
    with pytest.raises(CheckpointError, match=names(second, "model.norm.weight", str(first))):
        load(base_ckpt)


def test_index_references_missing_shard(base_ckpt: Path) -> None:
    """An index whose weight_map names a shard that does not exist raises naming that shard."""
    shard(base_ckpt, lambda keys: (keys[:5], keys[5:]))
    missing = base_ckpt / SHARD.format(2)
    missing.unlink()
    with pytest.raises(CheckpointError, match=names(missing)):
        load(base_ckpt)


def test_missing_tensor(base_ckpt: Path) -> None:
    """A tensor absent from the file raises naming it (and the checkpoint directory)."""
    edit_weights(base_ckpt, lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(
        CheckpointError, match=names(base_ckpt, "model.layers.1.mlp.up_proj.weight")
    ):
        load(base_ckpt)


def test_unexpected_tensor(base_ckpt: Path) -> None:
    """A tensor the model does not have raises naming it and the file holding it."""
    edit_weights(base_ckpt, lambda w: w.update({"model.extra.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=names(base_ckpt / WEIGHTS, "model.extra.weight")):
        load(base_ckpt)


def test_wrong_shape(base_ckpt: Path) -> None:
    """A wrongly shaped tensor raises naming the file, the tensor and both shapes."""
    edit_weights(base_ckpt, lambda w: w.update({"model.norm.weight": torch.ones(32)}))
    pattern = names(base_ckpt / WEIGHTS, "model.norm.weight", "[32]", "[64]")
    with pytest.raises(CheckpointError, match=pattern):
        load(base_ckpt)


@pytest.mark.parametrize("archs", [["GPT2LMHeadModel"], ["LlamaForCausalLM", "SDARForCausalLM"]])
def test_unsupported_architecture(base_ckpt: Path, archs: list[str]) -> None:
    """An architecture outside the registry raises naming it and listing the supported ones."""
    edit_config(base_ckpt, lambda c: c.update(architectures=archs))
    pattern = names(base_ckpt / "config.json", archs[0], "SDARForCausalLM")
    with pytest.raises(CheckpointError, match=pattern):
        load(base_ckpt)


@pytest.mark.parametrize("extra", [{}, {"architectures": []}], ids=["absent", "empty"])
def test_missing_architectures(base_ckpt: Path, extra: dict) -> None:
    """No (or an empty) 'architectures' field raises naming the field."""
    edit_config(base_ckpt, lambda c: (c.pop("architectures"), c.update(extra)))
    with pytest.raises(CheckpointError, match=names(base_ckpt / "config.json", "'architectures'")):
        load(base_ckpt)


@pytest.mark.parametrize(
    "field", ["hidden_size", "vocab_size", "rms_norm_eps", "num_hidden_layers"]
)
def test_missing_config_field(base_ckpt: Path, field: str) -> None:
    """A missing required backbone field raises naming the field and config.json."""
    edit_config(base_ckpt, lambda c: c.pop(field))
    with pytest.raises(CheckpointError, match=names(base_ckpt / "config.json", "missing", field)):
        load(base_ckpt)


def test_missing_orl_intermediate_size(orl_ckpt: Path) -> None:
    """An ORL adapter without intermediate_size raises naming 'orl_residual.intermediate_size'."""
    edit_config(orl_ckpt, lambda c: c["orl_residual"].pop("intermediate_size"))
    pattern = names(orl_ckpt / "config.json", "orl_residual.intermediate_size")
    with pytest.raises(CheckpointError, match=pattern):
        load(orl_ckpt)


@pytest.mark.parametrize(
    ("key", "value", "expect"),
    [
        ("positions", "everywhere", "orl_residual.positions"),
        ("gain", 2.0, "gain"),
        ("temperature", 0.0, "orl_residual.temperature"),
        ("intermediate_size", None, "orl_residual.intermediate_size"),
        ("temperature", "hot", "orl_residual.temperature"),
        ("strength", "x", "orl_residual.strength"),
        ("post_norm_scale", 0.0, "orl_residual.post_norm_scale"),
        ("post_norm_scale", -0.06, "orl_residual.post_norm_scale"),
    ],
    ids=[
        "positions",
        "unknown-key",
        "zero-temperature",
        "null-size",
        "str-temperature",
        "str-strength",
        "zero-post-norm",
        "negative-post-norm",
    ],
)
def test_bad_orl_field(orl_ckpt: Path, key: str, value: Any, expect: str) -> None:
    """A bad/null/non-numeric orl_residual value or an unknown key raises naming the field."""
    edit_config(orl_ckpt, lambda c: c["orl_residual"].update({key: value}))
    with pytest.raises(CheckpointError, match=names(orl_ckpt / "config.json", expect)):
        load(orl_ckpt)


@pytest.mark.parametrize("old_style", [True, False], ids=["top-level", "rope_parameters"])
def test_rope_theta(base_ckpt: Path, old_style: bool) -> None:
    """rope_theta is read from rope_parameters, or top-level in a pre-transformers-5 config."""
    if old_style:
        edit_config(base_ckpt, lambda c: (c.pop("rope_parameters"), c.update(rope_theta=123456.0)))
    else:
        edit_config(base_ckpt, lambda c: c["rope_parameters"].update(rope_theta=123456.0))
    ckpt = load(base_ckpt)
    assert ckpt.model.cfg.rope_theta == ckpt.config.rope_theta == 123456.0


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_unsupported_rope_type(base_ckpt: Path, key: str) -> None:
    """A non-default rope_type (yarn) raises naming the type and config.json."""
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
    edit_config(base_ckpt, lambda c: (c.pop("rope_parameters"), c.update({key: rope})))
    with pytest.raises(CheckpointError, match=names(base_ckpt / "config.json", "yarn")):
        load(base_ckpt)


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("{not json", "unreadable JSON"),
        (None, "not found"),
        ("[1, 2]", "object"),
    ],
    ids=["not-json", "missing", "not-object"],
)
def test_bad_config_json(base_ckpt: Path, text: str | None, expect: str) -> None:
    """A config.json that is missing, not JSON or not a JSON object raises naming config.json."""
    cfg = base_ckpt / "config.json"
    if text is None:
        cfg.unlink()
    else:
        cfg.write_text(text)
    with pytest.raises(CheckpointError, match=names(cfg, expect)):
        load(base_ckpt)


@pytest.mark.parametrize("cut", ["in-header", "in-data", "last-bytes"])
def test_corrupt_safetensors(base_ckpt: Path, cut: str) -> None:
    """A truncated .safetensors file (header or data cut short) raises naming the file."""
    data = (base_ckpt / WEIGHTS).read_bytes()
    data_start = 8 + int.from_bytes(data[:8], "little")  # u64 header length, then the JSON header
    keep = {"in-header": data_start // 2, "in-data": data_start + 16, "last-bytes": len(data) - 4}
    (base_ckpt / WEIGHTS).write_bytes(data[: keep[cut]])
    with pytest.raises(CheckpointError, match=names(base_ckpt / WEIGHTS, "unreadable")):
        load(base_ckpt)


def test_no_safetensors(base_ckpt: Path) -> None:
    """A checkpoint with no *.safetensors file raises naming the directory."""
    (base_ckpt / WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match=names(base_ckpt, "safetensors")):
        load(base_ckpt)


def test_not_a_directory(base_ckpt: Path) -> None:
    """A file is not a checkpoint directory; a missing path says so (loader and resolver)."""
    cases = (
        (base_ckpt / "config.json", "not a checkpoint directory"),
        (base_ckpt / "nope", "path does not exist"),
    )
    for path, what in cases:
        with pytest.raises(CheckpointError, match=names(path, what)):
            load(path)
        with pytest.raises(CheckpointError, match=names(path, what)):
            resolve_model_path(str(path))


def test_resolve_local_directory(base_ckpt: Path) -> None:
    """A local directory resolves to itself."""
    assert resolve_model_path(str(base_ckpt)) == base_ckpt


@pytest.mark.parametrize("dangling_ref", [False, True])
def test_resolve_uncached_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dangling_ref: bool
) -> None:
    """A hub id not in the HF cache (or whose refs/main has no snapshot) raises: never downloads."""
    if dangling_ref:
        (tmp_path / "hub" / "models--org--name" / "refs").mkdir(parents=True)
        (tmp_path / "hub" / "models--org--name" / "refs" / "main").write_text("abc123")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointError, match=r"org/name.*never downloads"):
        resolve_model_path("org/name")


def test_resolve_cached_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id in the HF cache resolves to the snapshot that refs/main points at, and loads."""
    repo = tmp_path / "hub" / "models--org--name"
    snap = write_checkpoint(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model_path("org/name") == snap
    assert load(resolve_model_path("org/name")).path == snap
