"""Non-finite numbers fail loudly: config scales that can only give NaN logits are refused at load
(naming the field), and a round whose logits are NaN / inf raises `NonFiniteError` naming the block
and the cause (`dlmrt/engine/nonfinite.py`); the engine serves the next request. CPU."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM
from dlmrt.errors import CheckpointError, NonFiniteError

PROMPT, KW = [5, 6, 7, 8, 9], dict(max_new_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("nonfinite") / "q")


def _edit_config(path, **fields):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "field, value", [("rope_theta", float("nan")), ("rms_norm_eps", -1.0), ("rope_theta", 0.0)]
)
@pytest.mark.parametrize("family", ["qwen", "llada2"])
def test_a_config_scale_out_of_range_is_refused_by_name(tmp_path, family, field, value):
    if family == "qwen":
        path = write_checkpoint(tmp_path / "q")
    else:
        path = write_llada2_checkpoint(tmp_path / "l", vocab_size=512)
    _edit_config(path, **{field: value})
    cfg = json.loads((path / "config.json").read_text())
    if isinstance(cfg.get("rope_parameters"), dict) and field == "rope_theta":
        cfg["rope_parameters"]["rope_theta"] = value  # transformers >= 5 nests it here
        (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=f"'{field}' = .* must be finite and > 0"):
        LLM(path)


def test_a_nan_weight_is_named_and_the_next_request_runs(qwen):
    llm = LLM(qwen, mode="eager")
    want = llm.generate(PROMPT, **KW).token_ids
    w = llm.model.model.layers[1].mlp.down_proj.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w[3, 5] = float("nan")
    with pytest.raises(NonFiniteError, match=r"block 0 .*'model.layers.1.mlp.down_proj.weight'"):
        llm.generate(PROMPT, **KW)
    with torch.no_grad():
        w.copy_(saved)
    assert llm.generate(PROMPT, **KW).token_ids == want  # nothing left hanging


def test_overflowing_activations_are_reported_as_such(qwen):
    """Finite weights, infinite activations (a gain of 1e38 on the final norm): no weight is
    named, the overflow is."""
    llm = LLM(qwen, mode="eager")
    with torch.no_grad():
        llm.model.model.norm.weight.fill_(1e38)
    with pytest.raises(NonFiniteError, match="no weight is non-finite: the activations overflowed"):
        llm.generate(PROMPT, **KW)


def test_a_healthy_model_never_raises(qwen):
    llm = LLM(qwen, mode="eager")
    for seed in range(3):
        llm.generate(PROMPT, temperature=0.9, seed=seed, **KW)


def test_diffusion_gemma_canvas_reports_a_nan_weight(tmp_path):
    import transformers.models.diffusion_gemma as dg
    from dg_helpers import _config, _prompt, save_checkpoint

    torch.manual_seed(0)
    path = save_checkpoint(dg.DiffusionGemmaForBlockDiffusion(_config()).eval(), tmp_path / "dg")
    llm = LLM(path, mode="eager")
    ok = llm.generate(_prompt(6, 0), max_new_tokens=8, rng="counter")
    with torch.no_grad():
        llm.model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"canvas 0 .*'model.layers.0.mlp.down_proj.weight'"):
        llm.generate(_prompt(6, 0), max_new_tokens=8, rng="counter")
    assert ok.token_ids is not None


def test_a_streamed_request_hands_over_nothing_from_a_nan_round(qwen):
    llm = LLM(qwen, mode="eager", prefix_reuse=False)
    w = llm.model.model.layers[1].mlp.down_proj.weight
    with torch.no_grad():
        w[3, 5] = float("nan")
    calls: list = []
    with pytest.raises(NonFiniteError):
        llm.generate(PROMPT, on_tokens=calls.append, **KW)
    assert calls == []  # every round of block 0 was NaN: its rows never reached the listener
