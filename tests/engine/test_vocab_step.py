"""A round's vocabulary in one pass (`engine/block/vocab_step.py`): where it applies, and on the
CPU (fp32: the op's twin) the same tokens as the logits path, folded commits included."""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint

from dlmrt import LLM, ops
from dlmrt.engine.block import vocab_step
from dlmrt.formats.fp8 import Fp8Weight
from dlmrt.impls.fp8_linear import Fp8Linear
from dlmrt.ops import choices

PROMPT = [(37 * i + 11) % 256 for i in range(11)]


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """Rows of every `ops.vocab_pass` call the rounds make (with DLMRT_VOCAB_PASS=on)."""
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "on")
    seen: list[int] = []
    real = ops.vocab_pass

    def counted(h, *args):
        seen.append(h.shape[0])
        return real(h, *args)

    monkeypatch.setattr(ops, "vocab_pass", counted)
    return seen


@pytest.mark.parametrize("z_temperature", [1.0, 0.5])  # the decoder's normaliser reused, or not
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("rule", ["threshold", "llada_editing"])  # editing: folded post-fill checks
def test_one_pass_rounds_give_the_logits_path_tokens(
    tmp_path, monkeypatch, calls, z_temperature, tied, rule
):
    # masked rows without a post-norm: an editing rule folds its post-fill check (engine/fold.py)
    residual = residual_config(post_norm_scale=None, temperature=z_temperature)
    path = write_checkpoint(tmp_path / "m", residual=residual)
    llm = LLM(path, device="cpu")
    if tied:
        llm.model.tie_lm_head()
    kw = {"rule": rule, "max_new_tokens": 24, "ignore_eos": True}
    one = llm.generate(PROMPT, **kw)
    assert calls and set(calls) <= {8}  # every round through the op, the block's rows
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "off")
    n = len(calls)
    off = llm.generate(PROMPT, **kw)
    assert len(calls) == n  # the knob turns it off
    assert one.token_ids == off.token_ids


def test_base_model_rounds_take_the_one_pass_without_z(tmp_path, calls):
    llm = LLM(write_checkpoint(tmp_path / "base"), device="cpu")
    out = llm.generate(PROMPT, max_new_tokens=16, ignore_eos=True)
    assert calls and len(out.token_ids) == 16


def test_where_it_does_not_apply(tmp_path, monkeypatch, calls):
    llm = LLM(write_checkpoint(tmp_path / "m", residual=residual_config()), device="cpu")
    model = llm.model
    assert vocab_step.one_pass(model, 0.0)
    assert choices.get("round vocabulary (greedy)").pick == "one pass"
    assert not vocab_step.one_pass(model, 0.7)  # sampling keeps today's inverse-CDF draw
    assert "inverse CDF" in choices.get("round vocabulary (sampled)").why
    llm.generate(PROMPT, max_new_tokens=8, temperature=0.7, seed=3)
    assert not calls
    head = model.lm_head
    vocab, hidden = head.weight.shape
    codes = torch.zeros(vocab, hidden, dtype=torch.float8_e4m3fn)
    model.lm_head = Fp8Linear(Fp8Weight(codes, torch.ones(vocab)), torch.float32)
    assert not vocab_step.one_pass(model, 0.0)  # an FP8 head keeps its GEMM
    assert "Fp8Linear" in choices.get("round vocabulary (greedy)").why
    model.lm_head = head
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "off")
    assert not vocab_step.one_pass(model, 0.0)
    monkeypatch.delenv("DLMRT_VOCAB_PASS")
    assert not vocab_step.one_pass(model, 0.0)  # off by default (slower on an H100)
    assert choices.get("round vocabulary (greedy)").why == "DLMRT_VOCAB_PASS=off"
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "maybe")
    with pytest.raises(ValueError, match="DLMRT_VOCAB_PASS='maybe'"):
        vocab_step.one_pass(model, 0.0)
