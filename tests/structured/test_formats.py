"""`response_format` parsing and the CLI's flags: pure Python, no grammar engine needed."""

from __future__ import annotations

import json

import pytest

from dlmrt.params import DecodeParams
from dlmrt.structured import ResponseFormat, from_cli, parse
from dlmrt.structured.formats import choices_regex

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}}


def test_text_and_none_mean_unconstrained():
    assert parse(None) is None and parse({"type": "text"}) is None
    assert DecodeParams(response_format={"type": "text"}).response_format is None


def test_each_kind_parses():
    body = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    assert parse(body) == ResponseFormat("json_schema", SCHEMA)
    assert parse({"type": "json_object"}) == ResponseFormat("json_object")
    assert parse({"type": "regex", "regex": "a+"}) == ResponseFormat("regex", "a+")
    assert parse({"type": "choices", "choices": ["x", "y"]}) == ResponseFormat(
        "choices", ("x", "y")
    )
    assert parse(json.dumps({"type": "json_object"})) == ResponseFormat("json_object")  # CLI


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": 3}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"schema": {}, "x": 1}},
            "response_format.json_schema",
        ),
        ({"type": "regex", "regex": ""}, "response_format.regex"),
        ({"type": "choices", "choices": []}, "response_format.choices"),
        ({"type": "choices", "choices": ["a", 2]}, "response_format.choices[1]"),
        ({"type": "regex", "regex": "a", "extra": 1}, "response_format"),
        ("{not json", "response_format"),
        ([1], "response_format"),
    ],
)
def test_bad_formats_name_the_part(value, part):
    with pytest.raises(ValueError) as e:
        DecodeParams(response_format=value)
    assert str(e.value).split(":")[0] == part


def test_params_keep_a_plain_request_form():
    p = DecodeParams(response_format={"type": "choices", "choices": ["a", "b"]})
    assert p.response_format == {"type": "choices", "choices": ["a", "b"]}
    assert parse(p.response_format) == ResponseFormat("choices", ("a", "b"))


def test_choices_regex_escapes_metacharacters():
    import re

    rx = choices_regex(("a.b", "(c)", "x|y"))
    assert re.fullmatch(rx, "a.b") and re.fullmatch(rx, "(c)") and re.fullmatch(rx, "x|y")
    assert not re.fullmatch(rx, "axb") and not re.fullmatch(rx, "x")


def test_cli_flags(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCHEMA))
    assert from_cli(str(path), None, None)["json_schema"]["schema"] == SCHEMA
    assert from_cli(None, "a+", None) == {"type": "regex", "regex": "a+"}
    assert from_cli(None, None, "yes,no") == {"type": "choices", "choices": ["yes", "no"]}
    assert from_cli(None, None, None) is None
    with pytest.raises(ValueError, match="at most one"):
        from_cli(str(path), "a", None)
    with pytest.raises(ValueError, match="--json-schema: cannot read"):
        from_cli(str(tmp_path / "missing.json"), None, None)
