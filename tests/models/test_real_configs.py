"""The released checkpoints' config files (`real_configs.py`: key for key, tiny widths) parse and
load: DiffusionGemma as shipped and as transformers >= 5.15 re-saves it, with its sampler class;
LLaDA-2.1-mini without eos / mask / QK-norm keys (the official defaults) and with them; SDAR-4B and
a fine-tune of it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import _byte_tokenizer, llada2_weights, tiny_qwen3_config
from real_configs import (
    DG_EOS,
    LLADA_MASK,
    LLADA_PAD,
    SDAR_EOS,
    SDAR_MASK,
    SDAR_VOCAB,
    dg_config,
    dg_config_resaved,
    dg_generation_config,
    dg_generation_config_resaved,
    llada21_mini_config,
    sdar_4b_config,
    sdar_4b_finetune_config,
)
from safetensors.torch import save_file

from dlmrt import LLM
from dlmrt.decoding.entropy_bound_canvas import CanvasSettings
from dlmrt.errors import CheckpointError
from dlmrt.models.config import model_config_from_hf
from dlmrt.models.diffusion_gemma_config import diffusion_gemma_config_from_hf
from dlmrt.models.llada2_config import llada2_config_from_hf

CFG = Path("config.json")


def _write(path: Path, config: dict, generation: dict | None = None) -> Path:
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path


# DiffusionGemma


def test_dg_config_as_shipped_and_as_resaved_read_the_same():
    shipped = diffusion_gemma_config_from_hf(dg_config(), CFG)
    assert shipped == diffusion_gemma_config_from_hf(dg_config_resaved(), CFG)
    assert shipped.head_dims == (8, 8, 8, 8, 8, 16) and shipped.kv_heads == (2, 2, 2, 2, 2, 1)
    assert shipped.eos_token_ids == tuple(DG_EOS)
    assert set(shipped.image_token_ids) == {255999, 258880, 258882}
    assert (shipped.rope["full_attention"].rotary_factor, shipped.final_logit_softcapping) == (
        0.25,
        30.0,
    )


@pytest.mark.parametrize("eos", [1, [1], [1, 106], [1, 106, 50], [1, 106, 50, 2, 3]])
def test_dg_root_eos_is_a_list_of_any_length(eos):
    cfg = {**dg_config(), "eos_token_id": eos}
    expected = (eos,) if isinstance(eos, int) else tuple(eos)
    assert diffusion_gemma_config_from_hf(cfg, CFG).eos_token_ids == expected


@pytest.fixture(scope="module")
def dg_ckpt(tmp_path_factory) -> tuple[Path, dict]:
    """A tiny DiffusionGemma saved by transformers from the shipped config.json (which it writes
    in the re-saved form), then given the shipped config.json and generation_config.json."""
    dg = pytest.importorskip("transformers.models.diffusion_gemma")
    path = _write(tmp_path_factory.mktemp("dg"), dg_config())
    torch.manual_seed(0)
    hf = dg.DiffusionGemmaForBlockDiffusion(dg.DiffusionGemmaConfig.from_pretrained(path))
    hf.save_pretrained(path)
    written = json.loads((path / "config.json").read_text())
    _byte_tokenizer().save(str(path / "tokenizer.json"))
    return _write(path, dg_config(), dg_generation_config()), written


def test_dg_resaved_fixture_is_what_transformers_writes(dg_ckpt, tmp_path):
    """transformers >= 5.15 writes `per_layer_config` and drops the global fields, and reading
    `head_dim` through it then raises: dlmrt reads the per-layer values itself."""
    heterogeneity = pytest.importorskip("transformers.integrations.heterogeneity")
    dg = pytest.importorskip("transformers.models.diffusion_gemma")
    written, expected = dg_ckpt[1], dg_config_resaved()
    assert written.keys() == expected.keys()
    assert written["text_config"] == expected["text_config"]
    text = dg.DiffusionGemmaConfig.from_pretrained(_write(tmp_path, expected)).text_config
    with pytest.raises(heterogeneity.AmbiguousGlobalPerLayerAttributeError):
        _ = text.head_dim


def _generate(path: Path) -> list[int]:
    llm = LLM(str(path), device="cpu", dtype="float32")
    assert llm.stop_ids == set(DG_EOS)
    assert llm.canvas_settings == CanvasSettings(
        max_denoising_steps=48,
        entropy_bound=0.1,
        t_min=0.4,
        t_max=0.8,
        stability_threshold=1,
        confidence_threshold=0.005,
    )
    # a few steps suffice to compare the two forms (the file's 48 would only take longer)
    out = llm.generate([7, 8, 9], max_new_tokens=8, seed=3, ignore_eos=True, max_denoising_steps=4)
    return out.token_ids


def test_dg_checkpoint_loads_in_both_config_forms(dg_ckpt, tmp_path):
    shipped = _generate(dg_ckpt[0])
    resaved = shutil.copytree(dg_ckpt[0], tmp_path / "resaved")
    assert _generate(_write(resaved, dg_config_resaved())) == shipped
    assert len(shipped) == 8


SAMPLER = {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.3}
GEN = Path("dg/generation_config.json")  # where the parsed settings were read (errors name it)


@pytest.mark.parametrize(
    "sampler, entropy_bound",
    [(SAMPLER, 0.3), ({"entropy_bound": 0.3}, 0.3), (None, 0.1)],
    ids=["class-name", "no-class-name", "null"],
)
def test_dg_known_sampler_class_sets_the_bound(sampler, entropy_bound):
    gen = {**dg_generation_config(), "sampler_config": sampler}
    assert CanvasSettings.from_generation_config(gen, GEN, None).entropy_bound == entropy_bound
    orl = {**dg_generation_config(), "orl": {"sampler_config": {**SAMPLER, "entropy_bound": 0.7}}}
    assert CanvasSettings.from_generation_config(orl, GEN, "orl").entropy_bound == 0.7


@pytest.mark.parametrize(
    "sampler, message",
    [
        ({"_cls_name": "MaskGITSamplerConfig", "temperature": 1.0}, "'MaskGITSamplerConfig'"),
        ({"_cls_name": None, "entropy_bound": 0.1}, "class None is not supported"),
        ({**SAMPLER, "top_k": 5}, r"EntropyBoundSamplerConfig has no field\(s\) \['top_k'\]"),
        ("EntropyBoundSamplerConfig", "'sampler_config' must be an object"),
    ],
)
def test_dg_unknown_sampler_class_is_named(sampler, message):
    gen = {**dg_generation_config(), "sampler_config": sampler}
    with pytest.raises(CheckpointError, match=f"generation_config.json: .*{message}"):
        CanvasSettings.from_generation_config(gen, GEN, None)


def test_dg_resaved_generation_config_of_nulls_gives_the_defaults():
    gen = dg_generation_config_resaved()
    assert CanvasSettings.from_generation_config(gen, GEN, None) == CanvasSettings()


# LLaDA-2.1-mini


def test_llada21_mini_as_shipped_gets_the_official_ids():
    assert not {"eos_token_id", "mask_token_id", "use_qk_norm"} & llada21_mini_config().keys()
    cfg = llada2_config_from_hf(llada21_mini_config(), CFG)
    assert (cfg.mask_token_id, cfg.eos_token_ids) == (LLADA_MASK, (LLADA_PAD,))
    assert (cfg.rotary_dim, cfg.head_dim, cfg.block_size) == (4, 8, 32)


def test_llada21_mini_with_the_keys_takes_the_file_values():
    raw = {**llada21_mini_config(), "eos_token_id": [156900, LLADA_PAD], "mask_token_id": 156894}
    cfg = llada2_config_from_hf({**raw, "use_qk_norm": True}, CFG)
    assert (cfg.mask_token_id, cfg.eos_token_ids) == (156894, (156900, LLADA_PAD))
    with pytest.raises(CheckpointError, match="'use_qk_norm' = False: only QK-norm"):
        llada2_config_from_hf({**raw, "use_qk_norm": False}, CFG)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"use_rmsnorm": False}, "'use_rmsnorm' = False: only RMSNorm"),
        ({"rotary_dim": 6}, "'rotary_dim' = 6 disagrees with 'partial_rotary_factor' = 0.5"),
        ({"pad_token_id": 157184}, r"'pad_token_id' = 157184 is not a token id in \[0, 157184\)"),
    ],
)
def test_llada21_mini_bad_values_are_named(override, message):
    with pytest.raises(CheckpointError, match=message):
        llada2_config_from_hf({**llada21_mini_config(), **override}, CFG)


def test_llada21_mini_checkpoint_as_shipped_loads(tmp_path):
    """The official ids win over the test tokenizer's own <|MASK|> and eos token; QK-norm on."""
    cfg = llada21_mini_config()
    weights = llada2_weights(cfg, seed=0)
    save_file(weights, str(tmp_path / "model.safetensors"))
    _byte_tokenizer().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    llm = LLM(str(_write(tmp_path, cfg)), device="cpu", dtype="float32")
    assert (llm.mask_id, llm.stop_ids) == (LLADA_MASK, {LLADA_PAD})
    name = "model.layers.0.attention.query_layernorm.weight"
    assert torch.equal(llm.model.state_dict()[name], weights[name])
    out = llm.generate([5, 6, 7], max_new_tokens=4, ignore_eos=True, block_length=4)
    assert len(out.token_ids) == 4


# SDAR-4B / QwenDLM


@pytest.mark.parametrize(
    "config, mask, block",
    [(sdar_4b_config, None, 256), (sdar_4b_finetune_config, SDAR_MASK, 4)],
    ids=["SDAR-4B-Chat", "fine-tune"],
)
def test_sdar_4b_config_parses(config, mask, block):
    cfg = model_config_from_hf(config(), CFG)
    assert (cfg.architecture, cfg.mask_token_id, cfg.block_size) == ("SDARForCausalLM", mask, block)
    assert (cfg.eos_token_ids, cfg.rope_theta, cfg.tie_word_embeddings) == ((SDAR_EOS,), 1e6, False)
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.vocab_size) == (8, 1, SDAR_VOCAB)


@pytest.mark.parametrize(
    "override", [{"hidden_act": "gelu"}, {"attention_bias": True}, {"use_sliding_window": True}]
)
def test_sdar_4b_unsupported_options_are_named(override):
    (name, value), message = next(iter(override.items())), "config field '{}' = {!r} is not"
    with pytest.raises(CheckpointError, match=re.escape(message.format(name, value))):
        model_config_from_hf({**sdar_4b_config(), **override}, CFG)


def test_sdar_4b_checkpoints_load(tmp_path):
    """Weights under Qwen3's names; the shipped config takes its mask from the tokenizer
    (<|MASK|>), the fine-tune's from config.json."""
    from transformers import Qwen3ForCausalLM

    sizes = dict(hidden_size=16, intermediate_size=32, num_attention_heads=4, head_dim=8)
    qwen = tiny_qwen3_config(vocab_size=SDAR_VOCAB, num_key_value_heads=1, **sizes)
    torch.manual_seed(0)
    Qwen3ForCausalLM(qwen).save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()  # transformers' (the test stop id)
    _byte_tokenizer().save(str(tmp_path / "tokenizer.json"))
    for config, mask, block in (
        (sdar_4b_config(), 259, 256),
        (sdar_4b_finetune_config(), SDAR_MASK, 4),
    ):
        llm = LLM(str(_write(tmp_path, config)), device="cpu", dtype="float32")
        assert (llm.mask_id, llm.stop_ids, llm.model_config.block_size) == (mask, {SDAR_EOS}, block)
        out = llm.generate([5, 6, 7], max_new_tokens=4, ignore_eos=True, block_length=4)
        assert len(out.token_ids) == 4
