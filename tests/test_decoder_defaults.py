"""A checkpoint's own default decoder (`dlmrt_decoder` in generation_config.json), CPU fp32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import residual_config, write_checkpoint

import dlmrt
from dlmrt.errors import CheckpointError
from dlmrt.params import ENTROPY_BUDGET, THRESHOLD, DecodeParams
from dlmrt.styles.decoder_defaults import DecoderDefaults

PROMPT = "What is 12+30?"
GEN = Path("ckpt/generation_config.json")


def test_request_then_checkpoint_then_dlmrt():
    """Each knob: the request's value, else the checkpoint's, else dlmrt's."""
    plain = DecoderDefaults.read("entropy_budget", {}, GEN)
    assert plain == DecoderDefaults("entropy_budget", THRESHOLD, ENTROPY_BUDGET)
    assert plain.resolve(DecodeParams()) == ("entropy_budget", THRESHOLD, ENTROPY_BUDGET)

    entry = {"dlmrt_decoder": {"rule": "threshold", "threshold": 0.5}}
    ckpt = DecoderDefaults.read("entropy_budget", entry, GEN)
    assert ckpt.resolve(DecodeParams()) == ("threshold", 0.5, ENTROPY_BUDGET)
    assert ckpt.resolve(DecodeParams(threshold=0.7)) == ("threshold", 0.7, ENTROPY_BUDGET)
    assert ckpt.resolve(DecodeParams(rule="entropy_budget")) == ("entropy_budget", 0.5, 0.8)
    assert ckpt.resolve(DecodeParams(editing="speed"))[0] == "llada_editing"

    budget_only = {"dlmrt_decoder": {"entropy_budget": 0.4}}  # the family's rule stays
    assert DecoderDefaults.read("entropy_budget", budget_only, GEN).resolve(DecodeParams()) == (
        "entropy_budget",
        THRESHOLD,
        0.4,
    )


def test_a_role_that_changes_the_rule_takes_the_familys_decoder():
    entry = {"dlmrt_decoder": {"rule": "threshold", "threshold": 0.5}}
    assert DecoderDefaults.read("threshold", entry, GEN, False) == DecoderDefaults("threshold")


def test_a_null_knob_is_unset():
    entry = {"dlmrt_decoder": {"rule": None, "threshold": None, "entropy_budget": 0.4}}
    ckpt = DecoderDefaults.read("threshold", entry, GEN)
    assert ckpt == DecoderDefaults("threshold", THRESHOLD, 0.4)
    assert ckpt.resolve(DecodeParams()) == ("threshold", THRESHOLD, 0.4)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ([0.4], "expected an object"),
        ({"rule": "threshold", "tau": 0.5}, r"unknown key\(s\) \['tau'\]"),
        ({"threshold": 1.5}, "threshold: must be"),
        ({"rule": "fastest"}, "rule: unknown rule 'fastest'"),
        ({"rule": "entropy_bound_canvas"}, "not a block-style rule"),
        ({"entropy_budget": "low"}, "entropy_budget"),
    ],
)
def test_a_malformed_entry_names_the_file_and_the_key(entry, message):
    with pytest.raises(CheckpointError, match=message) as info:
        DecoderDefaults.read("threshold", {"dlmrt_decoder": entry}, GEN)
    assert "generation_config.json: 'dlmrt_decoder'" in str(info.value)


def _with_decoder(src: Path, dst: Path, entry: object) -> Path:
    shutil.copytree(src, dst)
    path = dst / "generation_config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    cfg["dlmrt_decoder"] = entry
    path.write_text(json.dumps(cfg))
    return dst


def test_llm_decodes_with_the_checkpoints_decoder(tmp_path):
    """An ORL checkpoint (default rule entropy_budget) that ships threshold 0.3 decodes, with no
    knobs, exactly as the same weights asked for threshold 0.3 (and not as dlmrt's 0.9); a
    request's knob still wins; role="orl" keeps the entry, role="base" does not."""
    src = write_checkpoint(tmp_path / "orl", residual=residual_config())
    dst = _with_decoder(src, tmp_path / "orl-t03", {"rule": "threshold", "threshold": 0.3})
    plain = dlmrt.LLM(src, dtype="float32", device="cpu")
    shipped = dlmrt.LLM(dst, dtype="float32", device="cpu")
    assert plain.default_rule == "entropy_budget" and shipped.default_rule == "threshold"
    assert shipped.decoder == DecoderDefaults("threshold", 0.3, ENTROPY_BUDGET)

    def run(llm, **knobs):
        out = llm.generate(PROMPT, max_new_tokens=48, ignore_eos=True, **knobs)
        return out.token_ids, out.rounds_per_block

    assert run(shipped) == run(plain, rule="threshold", threshold=0.3)
    assert run(shipped) != run(plain, rule="threshold")  # 0.3 is not dlmrt's 0.9 here
    assert run(shipped, threshold=0.1) == run(plain, rule="threshold", threshold=0.1)
    assert run(shipped, threshold=0.1) != run(shipped)
    assert run(shipped, rule="entropy_budget") == run(plain, entropy_budget=ENTROPY_BUDGET)
    orl = dlmrt.LLM(dst, role="orl", dtype="float32", device="cpu")
    assert orl.decoder == shipped.decoder  # the rule it would get anyway: the entry applies
    base = dlmrt.LLM(dst, role="base", dtype="float32", device="cpu")
    assert base.decoder == DecoderDefaults("threshold")  # another role: the family's decoder


def test_llm_rejects_a_malformed_decoder_entry(tmp_path):
    src = write_checkpoint(tmp_path / "base")
    dst = _with_decoder(src, tmp_path / "bad", {"rule": "threshold", "threshold": -1})
    with pytest.raises(CheckpointError, match="generation_config.json: 'dlmrt_decoder': threshold"):
        dlmrt.LLM(dst, dtype="float32", device="cpu")
