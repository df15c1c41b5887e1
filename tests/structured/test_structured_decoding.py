"""Structured output end to end: every output parses and satisfies its schema / regex / choices,
on the demo model and tiny random QwenDLM and LLaDA2 checkpoints, under each block rule, with
generous and tight `max_new_tokens`. Needs llguidance (the `structured` extra; in `dev` too)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import write_checkpoint, write_llada2_checkpoint

pytest.importorskip("llguidance")

import dlmrt  # noqa: E402

PROMPT = "Sam has 23 apples. He buys 15 more, then gives away 9. How many apples does Sam have?"
DEMO_FORMAT = r" (\d+ [-+*/] \d+ = -?\d+\. )*The answer is -?\d+\."


def _exact_keys(d, keys) -> bool:
    return isinstance(d, dict) and set(d) == set(keys)


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


# name -> (schema, what a valid document satisfies beyond parsing)
SCHEMAS = {
    "answer_int": (
        {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
        lambda d: _exact_keys(d, ["answer"]) and type(d["answer"]) is int,
    ),
    "nested_array_enum": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8},
                "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
                "point": {
                    "type": "object",
                    "properties": {"x": {"type": "number"}, "y": {"type": "integer"}},
                    "required": ["x", "y"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "tags", "point"],
            "additionalProperties": False,
        },
        lambda d: (
            _exact_keys(d, ["name", "tags", "point"])
            and isinstance(d["name"], str)
            and len(d["name"]) <= 8
            and isinstance(d["tags"], list)
            and len(d["tags"]) <= 3
            and all(t in ("a", "b", "c") for t in d["tags"])
            and _exact_keys(d["point"], ["x", "y"])
            and _number(d["point"]["x"])
            and type(d["point"]["y"]) is int
        ),
    ),
    "string_escapes": (
        {
            "type": "object",
            "properties": {"s": {"type": "string"}},
            "required": ["s"],
            "additionalProperties": False,
        },
        lambda d: _exact_keys(d, ["s"]) and isinstance(d["s"], str),
    ),
    "bounded_numbers": (
        {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green"]},
                "n": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["color", "n"],
            "additionalProperties": False,
        },
        lambda d: (
            _exact_keys(d, ["color", "n"])
            and d["color"] in ("red", "green")
            and type(d["n"]) is int
            and 0 <= d["n"] <= 99
        ),
    ),
    "top_level_array": (
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
        lambda d: isinstance(d, list) and 1 <= len(d) <= 4 and all(type(x) is int for x in d),
    ),
}


def _json_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


def _assert_valid(text: str, name: str) -> None:
    doc = json.loads(text)  # raises: not JSON
    assert SCHEMAS[name][1](doc), f"{name}: {text!r} does not satisfy the schema"


@pytest.fixture(scope="module")
def demo() -> dlmrt.LLM:
    return dlmrt.LLM(device="cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dlmrt.LLM:
    path = write_checkpoint(tmp_path_factory.mktemp("sdar") / "base")
    return dlmrt.LLM(path, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def llada(tmp_path_factory) -> dlmrt.LLM:
    path = write_llada2_checkpoint(tmp_path_factory.mktemp("llada") / "l")
    return dlmrt.LLM(path, dtype="float32", device="cpu")


# (model fixture, rule knobs): each block rule on a model that accepts it
RUNS = [
    ("demo", {"rule": "threshold"}),
    ("demo", {"rule": "entropy_budget", "entropy_budget": 3.0}),
    ("tiny", {"rule": "threshold", "threshold": 0.5}),
    ("tiny", {"rule": "fixed_steps", "denoising_steps": 2}),
    ("llada", {"rule": "llada_editing", "editing": "speed"}),
]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize(("model", "knobs"), RUNS, ids=[f"{m}-{k['rule']}" for m, k in RUNS])
def test_schema_outputs_validate(request, name, model, knobs):
    llm = request.getfixturevalue(model)
    fmt = _json_format(SCHEMAS[name][0])
    out = llm.generate(PROMPT, max_new_tokens=64, response_format=fmt, **knobs)
    _assert_valid(out.text, name)
    # tight: a few tokens over the shortest document; the closing tokens are reserved
    budget = _shortest(llm, fmt) + 3
    tight = llm.generate(PROMPT, max_new_tokens=budget, response_format=fmt, **knobs)
    assert len(tight.token_ids) <= budget
    _assert_valid(tight.text, name)


def _shortest(llm, fmt: dict) -> int:
    """Tokens of the closing sequence from the start (what the budget check reserves)."""
    params = dlmrt.params.DecodeParams(max_new_tokens=256, response_format=fmt)
    return len(llm.style.constraint(params).closing)


@pytest.mark.parametrize("model", ["demo", "tiny", "llada"])
def test_regex_choices_and_json_object(request, model):
    llm = request.getfixturevalue(model)
    out = llm.generate(
        PROMPT, max_new_tokens=48, response_format={"type": "regex", "regex": DEMO_FORMAT}
    )
    assert re.fullmatch(DEMO_FORMAT, out.text), out.text
    choices = ["twenty-nine", "29", "no idea"]
    out = llm.generate(
        PROMPT, max_new_tokens=8, response_format={"type": "choices", "choices": choices}
    )
    assert out.text in choices
    out = llm.generate(PROMPT, max_new_tokens=32, response_format={"type": "json_object"})
    assert isinstance(json.loads(out.text), dict)


def test_sampling_stays_valid(tiny):
    fmt = _json_format(SCHEMAS["nested_array_enum"][0])
    for seed in range(3):
        out = tiny.generate(
            PROMPT, max_new_tokens=72, response_format=fmt, temperature=1.0, seed=seed
        )
        _assert_valid(out.text, "nested_array_enum")


def test_demo_answers_in_its_own_format_unchanged(demo):
    """The whole-format regex bites at every row yet leaves the demo's answer as it was."""
    plain = demo.generate(PROMPT, max_new_tokens=64)
    fmt = {"type": "regex", "regex": DEMO_FORMAT}
    assert demo.generate(PROMPT, max_new_tokens=64, response_format=fmt).text == plain.text


def test_unconstrained_tokens_unchanged(tiny):
    """{"type": "text"} is the unconstrained path itself: the same tokens, no grammar."""
    plain = tiny.generate(PROMPT, max_new_tokens=24)
    text = tiny.generate(PROMPT, max_new_tokens=24, response_format={"type": "text"})
    assert text.token_ids == plain.token_ids


def test_forced_tokens_skip_forwards(demo):
    """`{"answer":` is forced by the grammar: committed with no forward."""
    fmt = _json_format(SCHEMAS["answer_int"][0])
    ids = demo.tokenizer.encode(PROMPT)
    params = dlmrt.params.DecodeParams(max_new_tokens=16, response_format=fmt)
    res = demo.style.generate(ids, params, dlmrt.styles.Hooks())
    assert res.forced_tokens >= len(demo.tokenizer.encode('{"answer":'))
    assert res.denoising_forwards < len(res.token_ids)


def test_json_rows_right_of_the_frontier_are_judged_under_the_grammar(demo):
    """The demo never saw JSON: after `{"answer":` its rows lean to its own format (spaces, `=`)
    with digits behind. Masked on the speculated prefix (`structured.masked`), the rows right of
    the frontier pass the threshold on their digits: well under one forward per row (64 rows
    took 63 forwards with the frontier row alone masked)."""
    fmt = _json_format(SCHEMAS["answer_int"][0])
    params = dlmrt.params.DecodeParams(max_new_tokens=64, response_format=fmt)
    res = demo.style.generate(demo.tokenizer.encode(PROMPT), params, dlmrt.styles.Hooks())
    _assert_valid(demo.tokenizer.decode(res.token_ids), "answer_int")
    assert res.denoising_forwards <= 0.75 * len(res.token_ids)


def test_uncompilable_schema_names_the_part(demo):
    bad = _json_format({"type": "object", "properties": {"a": {"type": "strin"}}})
    with pytest.raises(ValueError, match=r"^response_format\.json_schema\.schema: .*strin"):
        demo.generate(PROMPT, response_format=bad)
    with pytest.raises(ValueError, match=r"^response_format\.regex: .*"):
        demo.generate(PROMPT, response_format={"type": "regex", "regex": "(ab"})


def test_budget_that_cannot_hold_a_document_is_refused(demo):
    fmt = _json_format(SCHEMAS["answer_int"][0])  # {"answer":0} needs 9 tokens here
    with pytest.raises(ValueError, match="^max_new_tokens: 4 tokens cannot hold"):
        demo.generate(PROMPT, max_new_tokens=4, response_format=fmt)


def test_missing_extra_names_it(monkeypatch):
    import sys

    from dlmrt.structured import grammar

    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(ValueError, match=r"dlmrt\[structured\]"):
        grammar.engine()


def test_recorder_is_refused(demo):
    fmt = {"type": "json_object"}
    with pytest.raises(ValueError, match="response_format: not supported with a recorder"):
        demo.generate(PROMPT, response_format=fmt, recorder=lambda record: None)


@pytest.mark.gpu
def test_gpu_runs_round_by_round(tmp_path: Path):
    """On CUDA a structured request replays the forward per round (never block_graph)."""
    llm = dlmrt.LLM(device="cuda", mode="auto")
    out = llm.generate(
        PROMPT, max_new_tokens=64, response_format={"type": "regex", "regex": DEMO_FORMAT}
    )
    assert re.fullmatch(DEMO_FORMAT, out.text) and out.mode == "round_graph"
    plain = llm.generate(PROMPT, max_new_tokens=64)
    assert plain.mode == llm.mode  # the unconstrained request keeps the engine's mode


def test_a_structured_request_decodes_with_the_one_pass_vocabulary_on(tiny, monkeypatch):
    """DLMRT_VOCAB_PASS=on: the grammar masks logits, so a structured request keeps the logits
    (its rounds never run the one pass); the unconstrained request beside it still does."""
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "on")
    fmt = _json_format(SCHEMAS["answer_int"][0])
    out = tiny.generate(PROMPT, max_new_tokens=32, response_format=fmt)
    _assert_valid(out.text, "answer_int")
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "off")
    assert tiny.generate(PROMPT, max_new_tokens=32, response_format=fmt).text == out.text


def test_a_nan_weight_fails_a_structured_request_loudly(tmp_path):
    """Non-finite logits raise `NonFiniteError` naming the weight, as unconstrained, and the
    engine keeps no rows of the request (prefix reuse); the next request runs."""
    from dlmrt.errors import NonFiniteError

    llm = dlmrt.LLM(write_checkpoint(tmp_path / "q"), dtype="float32", device="cpu")
    fmt = _json_format(SCHEMAS["answer_int"][0])
    want = llm.generate(PROMPT, max_new_tokens=32, response_format=fmt).text
    w = llm.model.model.layers[1].mlp.down_proj.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w[3, 5] = float("nan")
    with pytest.raises(NonFiniteError, match=r"block \d+ .*'model.layers.1.mlp.down_proj.weight'"):
        llm.generate(PROMPT, max_new_tokens=32, response_format=fmt)
    assert llm.engine.prefix.ids == []
    with torch.no_grad():
        w.copy_(saved)
    assert llm.generate(PROMPT, max_new_tokens=32, response_format=fmt).text == want


def test_the_turn_after_a_structured_request_reuses_its_committed_blocks(tiny, tmp_path):
    """A structured request's committed blocks are kept for prefix reuse as an unconstrained
    one's are (every generated block whose commit pass ran); the next turn decodes as cold."""
    cold = dlmrt.LLM(tiny.path, dtype="float32", device="cpu", prefix_reuse=False)
    block, fmt = tiny.model_config.block_size, {"type": "regex", "regex": "[a-z]{24}"}
    ids = tiny.tokenizer.encode(PROMPT)
    first = tiny.generate(ids, max_new_tokens=40, response_format=fmt)
    assert first.token_ids == cold.generate(ids, max_new_tokens=40, response_format=fmt).token_ids
    held = tiny.engine.prefix.ids
    assert len(held) > len(ids) // block * block  # generated blocks, not only the prompt's
    assert held == (ids + first.token_ids)[: len(held)] and len(held) % block == 0
    follow = ids + first.token_ids + tiny.tokenizer.encode(" And then?")
    for f in (fmt, None):
        out = tiny.generate(follow, max_new_tokens=24, response_format=f)
        assert out.num_cached_tokens == min(len(held), len(follow) // block * block), f
        assert (
            out.token_ids == cold.generate(follow, max_new_tokens=24, response_format=f).token_ids
        )
        held = tiny.engine.prefix.ids


def test_tensor_parallel_is_refused_by_name(demo, monkeypatch):
    """Each rank holds a vocabulary shard of the logits: a structured request is a named error."""
    monkeypatch.setattr(demo.style, "tensor_parallel", True)
    with pytest.raises(ValueError, match="tensor parallelism"):
        demo.generate(PROMPT, max_new_tokens=16, response_format={"type": "json_object"})
    assert demo.style.constraint(dlmrt.params.DecodeParams(max_new_tokens=16)) is None


# an array of objects with a long required key: `[{` opens a closing far longer than `[]`'s
LONG_KEY = "k" * 20
ARRAY_OF_OBJECTS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {LONG_KEY: {"type": "integer"}},
        "required": [LONG_KEY],
        "additionalProperties": False,
    },
}


@pytest.mark.parametrize("model", ["demo", "tiny"])
def test_a_token_that_opens_a_long_closing_is_refused_near_the_budget(request, model):
    """`{` forces its required key: the closing estimate counts it, so near the budget the
    search runs and refuses `{` rather than let the document outgrow `max_new_tokens`."""
    llm = request.getfixturevalue(model)
    for budget in (16, 22, 27, 40):
        out = llm.generate(
            PROMPT, max_new_tokens=budget, response_format=_json_format(ARRAY_OF_OBJECTS)
        )
        doc = json.loads(out.text)
        assert len(out.token_ids) <= budget and isinstance(doc, list)
        assert all(_exact_keys(d, [LONG_KEY]) and type(d[LONG_KEY]) is int for d in doc)


def test_a_document_that_cannot_close_is_cut_at_the_budget(demo, monkeypatch, caplog):
    """If the estimate lets a document outgrow the budget (here: no search ever runs), the
    request is cut at `max_new_tokens` with finish "length" and a warning, not an error."""
    import dlmrt.structured.grammar as grammar

    monkeypatch.setattr(grammar, "SLACK", -(10**6))
    fmt = _json_format(ARRAY_OF_OBJECTS | {"minItems": 1})
    out = demo.generate(PROMPT, max_new_tokens=40, response_format=fmt)
    assert len(out.token_ids) == 40 and out.finish_reason == "length"
    assert out.text.startswith('[{"' + LONG_KEY) and "can no longer close" in caplog.text
