"""Structured output on DiffusionGemma's canvases (`dlmrt/engine/encoder_decoder/structured.py`):
every output of a tiny random DiffusionGemma parses and satisfies its schema / regex / choices,
with generous and tight budgets, both noises; the grammar's step mask and the canvas settle on
their own. Needs llguidance (the `structured` extra) and transformers' DiffusionGemma."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import EOS_ID
from dg_helpers import byte_vocab_checkpoint
from test_structured_decoding import PROMPT, SCHEMAS, _assert_valid, _json_format

pytest.importorskip("llguidance")

import dlmrt  # noqa: E402
from dlmrt.engine.encoder_decoder.structured import CanvasGrammar  # noqa: E402
from dlmrt.params import DecodeParams  # noqa: E402

SETTINGS = dict(max_denoising_steps=4, stability_threshold=1, confidence_threshold=50.0)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> dlmrt.LLM:
    path = byte_vocab_checkpoint(tmp_path_factory, 3)
    return dlmrt.LLM(path, dtype="float32", device="cpu")


@pytest.mark.parametrize("rng", ["counter", "torch"])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_outputs_validate(gemma, name, rng):
    fmt = _json_format(SCHEMAS[name][0])
    out = gemma.generate(PROMPT, max_new_tokens=48, response_format=fmt, rng=rng, **SETTINGS)
    _assert_valid(out.text, name)
    assert out.mode == "eager"
    budget = (
        len(gemma.style.constraint(DecodeParams(max_new_tokens=256, response_format=fmt)).closing)
        + 3
    )
    tight = gemma.generate(PROMPT, max_new_tokens=budget, response_format=fmt, rng=rng)
    assert len(tight.token_ids) <= budget
    _assert_valid(tight.text, name)


def test_regex_choices_and_json_object(gemma):
    pattern = r"[a-z]{3,12}( [0-9]+)?\."
    out = gemma.generate(
        PROMPT, max_new_tokens=20, response_format={"type": "regex", "regex": pattern}
    )
    assert re.fullmatch(pattern, out.text), out.text
    choices = ["twenty-nine", "29", "no idea"]
    fmt = {"type": "choices", "choices": choices}
    assert gemma.generate(PROMPT, max_new_tokens=12, response_format=fmt).text in choices
    out = gemma.generate(PROMPT, max_new_tokens=24, response_format={"type": "json_object"})
    assert isinstance(json.loads(out.text), dict)


def test_sampled_canvases_stay_valid(gemma):
    fmt = _json_format(SCHEMAS["nested_array_enum"][0])
    for seed in range(3):
        out = gemma.generate(PROMPT, max_new_tokens=64, response_format=fmt, seed=seed)
        _assert_valid(out.text, "nested_array_enum")


def test_unconstrained_canvases_unchanged(gemma):
    plain = gemma.generate(PROMPT, max_new_tokens=16)
    text = gemma.generate(PROMPT, max_new_tokens=16, response_format={"type": "text"})
    assert text.token_ids == plain.token_ids


def test_budget_and_schema_errors_name_the_part(gemma):
    fmt = _json_format(SCHEMAS["nested_array_enum"][0])
    with pytest.raises(ValueError, match="max_new_tokens"):
        gemma.generate(PROMPT, max_new_tokens=4, response_format=fmt)
    with pytest.raises(ValueError, match="response_format.json_schema.schema"):
        gemma.generate(PROMPT, max_new_tokens=8, response_format=_json_format({"type": "strin"}))


def _grammar(llm, fmt: dict, budget: int = 32) -> CanvasGrammar:
    c = llm.style.constraint(DecodeParams(max_new_tokens=budget, response_format=fmt))
    return CanvasGrammar(c, {EOS_ID}, llm.model)


def test_the_step_mask_forces_what_the_grammar_forces(gemma):
    """`{"answer":` is forced: each of its rows keeps one finite logit, the grammar's token,
    whatever the model preferred; the mask leaves the grammar's state as it was."""
    g = _grammar(gemma, _json_format(SCHEMAS["answer_int"][0]))
    logits = torch.randn(8, 260, generator=torch.Generator().manual_seed(0))
    masked = g.mask(logits)
    forced = gemma.tokenizer.encode('{"answer":')
    for row, tok in enumerate(forced[:8]):
        assert torch.isfinite(masked[row]).sum() == 1 and torch.isfinite(masked[row, tok])
    assert g.c.history == []
    canvas = g.settle(masked).tolist()
    assert canvas[: len(forced[:8])] == forced[:8] and g.c.history == canvas


def test_the_settle_repairs_a_refused_row_and_ends_with_stops(gemma):
    """A canvas whose argmax breaks the grammar (unmasked logits) settles to a valid prefix: a
    refused row takes its best allowed token; after a complete document, stop rows."""
    fmt = {"type": "choices", "choices": ["yes", "no"]}
    g = _grammar(gemma, fmt)
    logits = torch.zeros(8, 260)
    for row, ch in enumerate("nonsense"):
        logits[row, gemma.tokenizer.encode(ch)[0]] = 5.0
    canvas = g.settle(logits).tolist()
    assert gemma.tokenizer.decode(canvas[:2]) == "no"
    assert canvas[2:] == [EOS_ID] * 6 and g.c.done
    assert (g.mask(logits).isfinite().sum(-1) == 1).all()  # done: stop rows only


def test_tensor_parallel_is_refused_by_name(gemma, monkeypatch):
    monkeypatch.setattr(gemma.style, "tensor_parallel", True)
    with pytest.raises(ValueError, match="tensor parallelism"):
        gemma.generate(PROMPT, max_new_tokens=16, response_format={"type": "json_object"})


def test_a_token_that_opens_a_long_closing_is_refused_near_the_budget(gemma):
    from test_structured_decoding import ARRAY_OF_OBJECTS, LONG_KEY, _exact_keys

    for budget in (16, 22, 27, 40):
        out = gemma.generate(
            PROMPT, max_new_tokens=budget, response_format=_json_format(ARRAY_OF_OBJECTS)
        )
        doc = json.loads(out.text)
        assert len(out.token_ids) <= budget and isinstance(doc, list)
        assert all(_exact_keys(d, [LONG_KEY]) and type(d[LONG_KEY]) is int for d in doc)


def test_canvases_after_a_complete_document_take_no_step(gemma):
    """With ignore_eos the request runs to its budget: once the document is complete, every
    later canvas is stop rows decided with no denoising step."""
    fmt = {"type": "choices", "choices": ["yes", "no"]}
    out = gemma.generate(PROMPT, max_new_tokens=32, response_format=fmt, ignore_eos=True)
    ids = out.token_ids
    end = ids.index(EOS_ID)
    assert gemma.tokenizer.decode(ids[:end]) in ("yes", "no") and set(ids[end:]) == {EOS_ID}
    assert len(ids) == 32 and out.rounds_per_block[0] > 0 and out.rounds_per_block[1:] == [0] * 3


def test_a_nan_weight_fails_a_structured_canvas_loudly(gemma):
    from dlmrt.errors import NonFiniteError

    fmt = {"type": "json_object"}
    want = gemma.generate(PROMPT, max_new_tokens=16, response_format=fmt).text
    w = next(p for n, p in gemma.model.named_parameters() if n.endswith("embed_tokens.weight"))
    saved = w.detach().clone()
    with torch.no_grad():
        w[:, 3] = float("nan")
    try:
        with pytest.raises(NonFiniteError, match="structured canvas step"):
            gemma.generate(PROMPT, max_new_tokens=16, response_format=fmt)
    finally:
        with torch.no_grad():
            w.copy_(saved)
    assert gemma.generate(PROMPT, max_new_tokens=16, response_format=fmt).text == want


def test_rows_after_the_chains_stop_token_are_stop_rows(gemma):
    """The chain reads `no` then the stop token: the rows after it are masked to the stop
    token (the document ends there), so they stop counting against the canvas's done test."""
    g = _grammar(gemma, {"type": "choices", "choices": ["yes", "no"]})
    logits = torch.zeros(8, 260)
    for row, tok in enumerate([*gemma.tokenizer.encode("no"), EOS_ID, *range(70, 75)]):
        logits[row, tok] = 5.0
    masked = g.mask(logits)
    assert (masked[3:].isfinite().sum(-1) == 1).all() and masked[3:, EOS_ID].isfinite().all()
    assert masked[0].isfinite().sum() == 2  # `n` or `y`
    assert g.settle(masked).tolist()[2:] == [EOS_ID] * 6
