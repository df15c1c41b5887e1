"""The Python API (`dlmrt.LLM`) end to end on tiny random checkpoints, CPU fp32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import EOS_ID, MASK_ID, residual_config, write_checkpoint

import dlmrt
from dlmrt.demo import DEMO_DIR, DEMO_FILES
from dlmrt.errors import CheckpointError
from dlmrt.outputs import GenerationOutput

PROMPT = "What is 12+30?"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("api")
    return {
        "base": write_checkpoint(root / "base"),
        "orl": write_checkpoint(root / "orl", residual=residual_config()),
    }


@pytest.fixture(scope="module")
def base_llm(ckpts) -> dlmrt.LLM:
    return dlmrt.LLM(ckpts["base"], dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def orl_llm(ckpts) -> dlmrt.LLM:
    return dlmrt.LLM(ckpts["orl"], dtype="float32", device="cpu")


def test_generate_output_fields(orl_llm):
    """GenerationOutput: text decodes token_ids, TPF = tokens / denoising forwards, tps > 0."""
    out = orl_llm.generate(PROMPT, max_new_tokens=12)
    assert isinstance(out, GenerationOutput)
    assert out.text == orl_llm.tokenizer.decode(out.token_ids)
    assert 1 <= len(out.token_ids) <= 12
    assert out.num_denoising_forwards == sum(out.rounds_per_block) > 0
    assert out.tokens_per_forward == len(out.token_ids) / out.num_denoising_forwards
    assert out.request_tps > 0 and out.request_time_s > 0
    assert out.finish_reason in {"stop", "length"}
    assert out.prompt_tokens == len(orl_llm.tokenizer.encode(PROMPT))


@pytest.mark.parametrize("n", [1, 5, 13])
def test_max_new_tokens_exact(base_llm, n):
    """With ignore_eos, exactly max_new_tokens tokens come back (block 8), finish 'length'."""
    out = base_llm.generate(PROMPT, max_new_tokens=n, ignore_eos=True)
    assert len(out.token_ids) == n
    assert out.finish_reason == "length"


@pytest.mark.parametrize("block", [1, 4, 8])
def test_block_length_override(base_llm, block):
    """block_length overrides the checkpoint's block (8) with one no larger: at most `block`
    rounds per block, n tokens."""
    out = base_llm.generate(PROMPT, max_new_tokens=10, ignore_eos=True, block_length=block)
    assert len(out.token_ids) == 10
    assert len(out.rounds_per_block) == -(-(14 + 10) // block) - 14 // block
    assert all(1 <= r <= block for r in out.rounds_per_block)


def test_a_block_wider_than_trained_and_an_infinite_budget_are_refused(base_llm):
    with pytest.raises(
        ValueError, match="block_length: 16 is larger than the checkpoint's block_size 8"
    ):
        base_llm.generate(PROMPT, max_new_tokens=4, block_length=16)
    with pytest.raises(ValueError, match="entropy_budget: must be in"):
        base_llm.generate(PROMPT, max_new_tokens=4, entropy_budget=float("inf"))


@pytest.mark.parametrize("prompt", ["12345678", [7] * 16])
def test_block_aligned_prompts(base_llm, prompt):
    """A prompt filling whole blocks (no tail) still generates exactly n tokens."""
    out = base_llm.generate(prompt, max_new_tokens=9, ignore_eos=True)
    assert len(out.token_ids) == 9 and out.num_prefill_forwards == 1
    assert len(out.rounds_per_block) == 2


def test_the_engine_decodes_an_empty_prompt(base_llm):
    """`LLM` refuses an empty prompt; the engine itself decodes one (no prefill forward)."""
    from dlmrt.decoding import make_rule

    out = base_llm.engine.generate(
        [],
        rule=make_rule("threshold"),
        block_length=base_llm.model_config.block_size,
        max_new_tokens=9,
        mask_id=base_llm.mask_id,
        stop_ids=set(),
        ignore_eos=True,
    )
    assert len(out.token_ids) == 9 and out.prefill_forwards == 0


def test_stop_id_truncates_output(ckpts, tmp_path):
    """A generated stop id ends the output (kept as last token): a prefix of the ignore_eos run."""
    path = shutil.copytree(ckpts["base"], tmp_path / "stop")
    full = dlmrt.LLM(path, dtype="float32").generate(PROMPT, max_new_tokens=16, ignore_eos=True)
    ids = full.token_ids
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])  # first occurrence at k >= 2
    gen_cfg = json.loads((path / "generation_config.json").read_text())
    gen_cfg["eos_token_id"] = ids[k]
    (path / "generation_config.json").write_text(json.dumps(gen_cfg))
    llm = dlmrt.LLM(path, dtype="float32")
    assert llm.stop_ids == {ids[k]}
    out = llm.generate(PROMPT, max_new_tokens=16)
    assert out.token_ids == ids[: k + 1]
    assert out.finish_reason == "stop"
    again = llm.generate(PROMPT, max_new_tokens=16, ignore_eos=True)
    assert again.token_ids == ids and again.finish_reason == "length"


def test_default_stop_id_is_eos(base_llm):
    """The tiny checkpoints stop on EOS (id 256) from generation_config.json."""
    assert base_llm.stop_ids == {EOS_ID}
    assert base_llm.mask_id == MASK_ID


def test_unknown_keyword_is_type_error(base_llm):
    """An unknown generate() keyword raises TypeError naming it."""
    with pytest.raises(TypeError, match="max_tokens"):
        base_llm.generate(PROMPT, max_tokens=4)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_new_tokens", 0),
        ("max_new_tokens", "5"),
        ("max_new_tokens", True),
        ("threshold", 1.5),
        ("threshold", float("nan")),
        ("entropy_budget", -1),
        ("temperature", -0.1),
        ("temperature", 1e-39),  # logits / T overflows float32: refused, not a NaN 'weights' error
        ("temperature", 5e-324),
        ("rule", "nope"),
        ("block_length", 0),
        ("seed", -1),
        ("ignore_eos", 1),
    ],
)
def test_invalid_decode_value_names_field(base_llm, field, value):
    """An invalid DecodeParams value raises ValueError whose message starts with the field name."""
    with pytest.raises(ValueError, match=f"^{field}"):
        base_llm.generate(PROMPT, **{field: value})


def test_the_smallest_temperature_samples(base_llm):
    """MIN_TEMPERATURE, the smallest one accepted, samples (no non-finite logits error)."""
    from dlmrt.params import MIN_TEMPERATURE

    out = base_llm.generate(PROMPT, max_new_tokens=9, temperature=MIN_TEMPERATURE, ignore_eos=True)
    assert len(out.token_ids) == 9 and all(
        0 <= t < base_llm.model_config.vocab_size for t in out.token_ids
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"dtype": "float64"}, "dtype"), ({"role": "bad"}, "role"), ({"mode": "bad"}, "mode")],
)
def test_invalid_engine_value_names_field(ckpts, kwargs, field):
    """An invalid LLM() argument raises ValueError naming the field."""
    with pytest.raises(ValueError, match=f"^{field}"):
        dlmrt.LLM(ckpts["base"], **kwargs)


def test_prompt_too_long_for_positions(base_llm):
    """prompt + max_new_tokens (in whole blocks) beyond max_position_embeddings raises."""
    with pytest.raises(ValueError, match="max_position_embeddings"):
        base_llm.generate([5] * 1000, max_new_tokens=100)


@pytest.mark.parametrize("bad", [260, 10_000, -1])
def test_prompt_token_outside_vocab(base_llm, bad):
    """A prompt token id outside [0, vocab) raises ValueError naming the id."""
    with pytest.raises(ValueError, match=f"token id {bad} "):
        base_llm.generate([1, 2, bad, 3], max_new_tokens=4)


def test_chat_needs_text_prompt(base_llm):
    """chat=True with a token-id prompt raises ValueError naming chat."""
    with pytest.raises(ValueError, match="^chat"):
        base_llm.generate([1, 2, 3], chat=True, max_new_tokens=4)


@pytest.mark.parametrize(
    ("which", "role", "rule"),
    [
        ("orl", None, "entropy_budget"),
        ("base", None, "threshold"),
        ("orl", "base", "threshold"),
    ],
)
def test_default_rule(ckpts, which, role, rule):
    """ORL checkpoints (adapter) default to entropy_budget, Base to threshold; role overrides."""
    assert dlmrt.LLM(ckpts[which], role=role, dtype="float32").default_rule == rule


def test_role_orl_needs_an_adapter(ckpts):
    """role='orl' on a Base QwenDLM checkpoint is an error naming the file (as for LLaDA2)."""
    with pytest.raises(CheckpointError, match="config.json: role='orl' needs an ORL checkpoint"):
        dlmrt.LLM(ckpts["base"], role="orl", dtype="float32")


def test_request_arguments_are_checked_before_decoding(base_llm):
    """An empty prompt, a non-bool chat and non-callable callbacks are named errors."""
    for prompt in ("", []):
        with pytest.raises(ValueError, match="prompt: is empty"):
            base_llm.generate(prompt, max_new_tokens=4)
    with pytest.raises(TypeError, match="chat: expected True or False"):
        base_llm.generate("hi", chat="yes", max_new_tokens=4)
    for name in ("recorder", "on_progress", "should_stop"):
        with pytest.raises(TypeError, match=f"{name}: expected a callable"):
            base_llm.generate("hi", max_new_tokens=4, **{name: 3})


def test_on_block_is_a_deprecated_alias_of_on_progress(base_llm):
    """`on_block` (the former name) still receives the progress calls, with a DeprecationWarning;
    passing both names is an error."""
    kw = dict(max_new_tokens=8, ignore_eos=True)
    new, old = [], []
    base_llm.generate(PROMPT, on_progress=lambda *a: new.append(a), **kw)
    with pytest.warns(DeprecationWarning, match="on_progress"):
        base_llm.generate(PROMPT, on_block=lambda *a: old.append(a), **kw)
    assert old == new and new
    with pytest.raises(TypeError, match="not both"):
        base_llm.generate(PROMPT, on_progress=print, on_block=print, **kw)


def test_sampling_seeded(base_llm):
    """temperature 1: the same seed gives the same tokens, different seeds different tokens."""
    kw = dict(max_new_tokens=16, temperature=1.0, ignore_eos=True)
    a = base_llm.generate(PROMPT, seed=1, **kw).token_ids
    assert base_llm.generate(PROMPT, seed=1, **kw).token_ids == a
    assert base_llm.generate(PROMPT, seed=2, **kw).token_ids != a


def test_recorder_rounds(orl_llm):
    """The recorder sees one record per forward; z is 0 only in a block's first round; counts add up."""
    prompt, block = [72, 101, 108, 108, 111], 8  # tail of 5 rows in block 0; 3 blocks in all
    records = []
    out = orl_llm.generate(prompt, max_new_tokens=19, ignore_eos=True, recorder=records.append)
    assert len(records) == out.num_denoising_forwards
    full = torch.tensor(prompt + out.token_ids)
    assert len(full) == 3 * block
    for b in range(3):
        recs = [r for r in records if r.block_index == b]
        assert [r.round for r in recs] == list(range(out.rounds_per_block[b]))
        assert not recs[0].z.any()
        assert all(r.z.any() for r in recs[1:])
        assert recs[-1].accepted.equal(recs[-1].unresolved)  # the last round finishes the block
        target = full[b * block : (b + 1) * block]
        for prev, nxt in zip(recs, recs[1:]):
            assert prev.unresolved.sum() - prev.accepted.sum() == nxt.unresolved.sum()
            assert prev.canvas_after.equal(nxt.canvas)  # the trace's rows chain
        assert recs[-1].canvas_after.equal(target)  # the last round leaves the final tokens
        for r in recs:  # accepted rows take the round's proposal; confidences are probabilities
            assert r.canvas_after[r.accepted].equal(r.proposal[r.accepted])
            assert ((r.confidence >= 0) & (r.confidence <= 1)).all()
        for r in recs:
            assert not (r.accepted & ~r.unresolved).any()
            assert r.canvas[~r.unresolved].equal(target[~r.unresolved])
            assert (r.canvas[r.unresolved] == MASK_ID).all()
    assert records[0].unresolved.tolist() == [False] * 5 + [True] * 3


def test_token_id_prompt_equals_text(base_llm):
    """A prompt given as token ids generates the same as the equivalent text."""
    ids = base_llm.tokenizer.encode(PROMPT)
    a = base_llm.generate(PROMPT, max_new_tokens=10)
    b = base_llm.generate(ids, max_new_tokens=10)
    assert a.token_ids == b.token_ids and a.prompt_tokens == b.prompt_tokens == len(ids)


def test_demo_model_is_embedded_and_solves_held_out_problems():
    """LLM() loads the shipped demo (<= 16 MB) and solves held-out arithmetic problems.

    The model card reports 97.7% on 300 held-out problems with threshold 0.9 (CPU and H200); 50
    problems at >= 90% leaves room for a few misses but not for a broken model or decoder.
    """
    from dlmrt.tasks import get_task
    from dlmrt.train.evaluate import evaluate

    assert sum((DEMO_DIR / name).stat().st_size for name in DEMO_FILES) <= 16 * 2**20
    llm = dlmrt.LLM(device="cpu")
    assert Path(llm.path) == DEMO_DIR and llm.default_rule == "threshold"
    result = evaluate(llm, get_task("arithmetic"), 50, rule="threshold", threshold=0.9)
    assert result["accuracy"] >= 0.9, result
    assert result["tokens_per_forward"] > 4, result  # parallel decoding, not one token a round


def test_demo_model_answers_a_word_problem():
    out = dlmrt.LLM(device="cpu").generate(
        "Tom has 23 apples. He buys 15 more and gives away 9. How many apples now?"
    )
    assert out.text.strip().endswith("The answer is 29.") and out.finish_reason == "stop"


def test_incomplete_demo_install_is_a_clear_error(monkeypatch, tmp_path):
    import dlmrt.demo

    monkeypatch.setattr(dlmrt.demo, "DEMO_DIR", tmp_path)
    with pytest.raises(CheckpointError, match="embedded demo model is incomplete"):
        dlmrt.LLM(device="cpu")


def test_a_tokenizer_id_outside_the_models_vocabulary_is_named(base_llm, monkeypatch):
    vocab = base_llm.model_config.vocab_size
    monkeypatch.setattr(base_llm.tokenizer, "encode", lambda text: [5, vocab + 3])
    with pytest.raises(ValueError, match=f"token id {vocab + 3} .* vocabulary has {vocab} ids"):
        base_llm.generate("hi", max_new_tokens=2)
