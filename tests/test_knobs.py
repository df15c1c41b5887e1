"""Each rule's knobs are declared once (dlmrt/rules.py) and everything else derives from them: the
DecodeParams field (default, help, bounds), the CLI flag, the HTTP field, bench sweeps, make_rule,
the canvas decoder's and the checkpoint's defaults. The last test declares a knob that does not
exist and finds it everywhere, so adding a knob is one declaration (plus the rule's use of it)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlmrt.knobs import Knob
from dlmrt.params import DecodeParams, RequestParams
from dlmrt.rules import BLOCK, ENCODER_DECODER, KNOBS, RULE_OF_KNOB, RULES, knob_help, style_knobs

ROOT = Path(__file__).resolve().parents[1]
ALL = list(KNOBS.values())
IDS = list(KNOBS)


def good_value(knob: Knob):
    """A value inside the knob's bounds (and not its default)."""
    if knob.choices:
        return knob.choices[-1]
    if knob.type is int:
        return int(knob.low) + 2
    return (knob.low + knob.high) / 2


def bad_values(knob: Knob) -> list[tuple[object, str]]:
    """(value, what the error says after 'name: ') for each bound and the type."""
    if knob.choices:
        return [("nope", "expected"), (3, "expected")]
    out = [("3", "expected"), (True, "expected"), (knob.low - 1, "must be")]
    if knob.high is not None:
        out.append((knob.high * 2, "must be"))
    if knob.type is int:
        out.append((float(knob.low + 1), "expected an integer"))
    if knob.above_low:
        out.append((knob.low, "must be >"))
    return out


def test_the_registry_is_torch_free_and_complete():
    code = "import sys, dlmrt.rules, dlmrt.params; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    assert set(RULE_OF_KNOB) == set(KNOBS)
    assert {k.name for info in RULES.values() for k in info.knobs} == set(KNOBS)
    assert set(style_knobs(BLOCK)) | set(style_knobs(ENCODER_DECODER)) == set(ALL)


def test_decode_params_fields_are_the_request_fields_and_the_knobs():
    request = [f.name for f in dataclasses.fields(RequestParams)]
    assert [f.name for f in dataclasses.fields(DecodeParams)] == request + IDS
    assert not set(request) & set(KNOBS)


@pytest.mark.parametrize("knob", ALL, ids=IDS)
def test_each_knob_is_a_field_with_its_default_help_and_bounds(knob):
    f = {f.name: f for f in dataclasses.fields(DecodeParams)}[knob.name]
    assert f.default == knob.default and f.type == knob.annotation
    assert f.metadata["help"] == knob_help(knob) and knob.help in f.metadata["help"]
    assert getattr(DecodeParams(), knob.name) == knob.default
    assert getattr(DecodeParams(**{knob.name: good_value(knob)}), knob.name) == good_value(knob)
    for value, says in bad_values(knob):
        with pytest.raises(ValueError, match=f"^{knob.name}: {re.escape(says)}"):
            DecodeParams(**{knob.name: value})
    if knob.checkpoint:
        assert str(knob.fallback) in f.metadata["help"]  # the help says what None means


@pytest.mark.parametrize("knob", ALL, ids=IDS)
def test_each_knob_is_a_cli_flag(knob):
    from dlmrt.cli import build_parser

    flag = "--" + knob.name.replace("_", "-")
    for command in (["generate", "x"], ["bench", "--dataset", "d"]):
        args = build_parser().parse_args([*command, flag, str(good_value(knob))])
        assert getattr(args, knob.name) == good_value(knob)
        assert getattr(build_parser().parse_args(command), knob.name) == knob.default
    if knob.choices:
        with pytest.raises(SystemExit):
            build_parser().parse_args(["generate", "x", flag, "nope"])


@pytest.mark.parametrize("knob", ALL, ids=IDS)
def test_each_knob_is_a_server_field_checked_by_decode_params(knob):
    from dlmrt.server.protocol import (
        APIError,
        ChatCompletionRequest,
        CompletionRequest,
        _decode_params,
    )

    for model in (CompletionRequest, ChatCompletionRequest):
        assert model.model_fields[knob.name].default is None
    req = CompletionRequest(prompt="x", **{knob.name: good_value(knob)})
    assert getattr(_decode_params(req, 4), knob.name) == good_value(knob)
    value = "nope" if knob.choices else knob.low - 1  # the right type, out of bounds
    with pytest.raises(APIError) as err:
        _decode_params(CompletionRequest(prompt="x", **{knob.name: value}), 4)
    assert err.value.status == 400 and err.value.param == knob.name


@pytest.mark.parametrize("knob", ALL, ids=IDS)
def test_each_knob_can_be_swept(knob):
    from dlmrt.bench.runner import sweep_points

    (label, value, params), *_ = sweep_points(f"{knob.name}={good_value(knob)}", DecodeParams())
    assert value == good_value(knob) == getattr(params, knob.name)
    owner = RULE_OF_KNOB[knob.name]
    assert params.rule == (owner.name if owner.style == BLOCK else None)
    bad = "nope" if knob.choices else knob.low - 1
    with pytest.raises(ValueError, match=f"^{knob.name}: "):
        sweep_points(f"{knob.name}={bad}", DecodeParams())


@pytest.mark.parametrize("knob", ALL, ids=IDS)
def test_a_knob_of_the_other_style_is_refused_by_name(knob):
    from dlmrt.styles.checks import check_rule_style

    style = RULE_OF_KNOB[knob.name].style
    params = DecodeParams(**{knob.name: good_value(knob)})
    check_rule_style(params, style, "Arch")
    other = BLOCK if style == ENCODER_DECODER else ENCODER_DECODER
    with pytest.raises(ValueError, match=f"^{knob.name}: "):
        check_rule_style(params, other, "Arch")


@pytest.mark.parametrize(
    "rule", [r for r in RULES.values() if r.style == BLOCK], ids=lambda r: r.name
)
def test_make_rule_passes_each_declared_knob(rule):
    from dlmrt.decoding import BUILDERS, make_rule

    assert set(BUILDERS) == {r.name for r in RULES.values() if r.style == BLOCK}
    given = {k.name: good_value(k) for k in rule.knobs}
    built = make_rule(rule.name, **given)
    for name, value in given.items():
        if name in {f.name for f in dataclasses.fields(built)}:
            assert getattr(built, name) == value
    fallbacks = make_rule(rule.name, denoising_steps=3)  # the rest: the declared fallbacks
    for k in rule.knobs:
        if k.name != "denoising_steps" and hasattr(fallbacks, k.name):
            assert getattr(fallbacks, k.name) == k.fallback


def test_the_other_places_that_name_knobs_agree_with_the_declarations():
    from dlmrt.decoding.entropy_bound_canvas import RNG_MODES, CanvasSettings
    from dlmrt.decoding.llada_editing import PRESETS
    from dlmrt.styles.decoder_defaults import KNOBS as CHECKPOINT_KNOBS
    from dlmrt.styles.decoder_defaults import DecoderDefaults
    from dlmrt.train.orl.config import DECODER_KNOBS

    canvas = style_knobs(ENCODER_DECODER, checkpoint=True)
    assert [(f.name, f.default) for f in dataclasses.fields(CanvasSettings)] == [
        (k.name, k.fallback) for k in canvas
    ]
    block = style_knobs(BLOCK, checkpoint=True)
    assert CHECKPOINT_KNOBS == ("rule", *(k.name for k in block))
    assert [(f.name, f.default) for f in dataclasses.fields(DecoderDefaults)][1:] == [
        (k.name, k.fallback) for k in block
    ]
    assert tuple(PRESETS) == KNOBS["editing"].choices and RNG_MODES == KNOBS["rng"].choices
    assert set(DECODER_KNOBS) <= set(KNOBS)


def test_the_playground_sends_declared_fields_only():
    """The page is static HTML: its inputs are a hand-picked subset, checked here."""
    html = (ROOT / "dlmrt" / "server" / "playground.html").read_text()
    fields = {f.name for f in dataclasses.fields(DecodeParams)}
    for group in re.findall(r"const (?:INT|FLOAT|CHOICE)_KNOBS = \[(.*?)\];", html):
        assert set(re.findall(r'"(\w+)"', group)) <= fields
    options = re.search(r'<select id="rule">(.*?)</select>', html, re.S).group(1)
    assert set(re.findall(r"<option>(\w+)</option>", options)) == {
        r.name for r in RULES.values() if r.style == BLOCK
    }


NEW_KNOB = """
import dataclasses, sys
import dlmrt.rules as rules
from dlmrt.knobs import Knob

knob = Knob("min_accept", int, "`threshold` rule: rows accepted per round at least", 1, low=1)
info = rules.RULES["threshold"]
rules.RULES["threshold"] = dataclasses.replace(info, knobs=(*info.knobs, knob))
rules.KNOBS[knob.name], rules.RULE_OF_KNOB[knob.name] = knob, rules.RULES["threshold"]

from dlmrt.params import DecodeParams
from dlmrt.cli import build_parser
assert "torch" not in sys.modules
assert DecodeParams().min_accept == 1 and DecodeParams(min_accept=3).min_accept == 3
try:
    DecodeParams(min_accept=0)
    raise AssertionError("not checked")
except ValueError as e:
    assert str(e) == "min_accept: must be >= 1, got 0", e
assert build_parser().parse_args(["generate", "x", "--min-accept", "4"]).min_accept == 4

from dlmrt.server.protocol import CompletionRequest, _decode_params
assert _decode_params(CompletionRequest(prompt="x", min_accept=2), 4).min_accept == 2
from dlmrt.bench.runner import sweep_points
assert [p.min_accept for _, _, p in sweep_points("min_accept=2,3", DecodeParams())] == [2, 3]

import dlmrt.decoding as decoding
seen = {}
decoding.BUILDERS["threshold"] = lambda **kw: seen.update(kw)  # the rule's class would read it
decoding.make_rule("threshold", min_accept=5)
assert seen == {"threshold": 0.9, "min_accept": 5}, seen
"""


def test_a_new_knob_needs_its_declaration_only():
    """A knob added to one rule's tuple in dlmrt/rules.py (in a fresh interpreter, before anything
    derives from the registry) is a checked field, a flag, an HTTP field, a sweep and a keyword
    of the rule's class."""
    subprocess.run([sys.executable, "-c", NEW_KNOB], check=True, cwd=ROOT)
