"""ResponseFormat: a request's `response_format`, checked for shape (no grammar engine needed).

Accepted forms (OpenAI's first two, then dlmrt's):

    {"type": "text"}                                      no constraint (normalised to None)
    {"type": "json_object"}                               any JSON object
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
    {"type": "regex", "regex": "<pattern>"}               the whole answer matches the pattern
    {"type": "choices", "choices": ["A", "B", ...]}       the answer is one of the strings

A JSON string of one of these is parsed first (the CLI's `--response-format`). Errors are
ValueErrors starting `response_format...:` so the server can answer 400 naming the part.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("text", "json_object", "json_schema", "regex", "choices")
_REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~")


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    kind: str  # json_object | json_schema | regex | choices
    value: Any = None  # the schema (dict), the pattern (str) or the choices (tuple of str)

    def key(self) -> str:
        """A stable text of the format (the compiled-grammar cache key)."""
        return json.dumps([self.kind, self.value], sort_keys=True)


def _fail(part: str, why: str) -> ValueError:
    return ValueError(f"{part}: {why}")


def parse(value: Any) -> ResponseFormat | None:
    """The checked `ResponseFormat` of a request's `response_format` (None: unconstrained)."""
    if value is None:
        return None
    if isinstance(value, ResponseFormat):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise _fail("response_format", f"not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise _fail("response_format", f"expected an object, got {type(value).__name__}")
    kind = value.get("type")
    if kind not in KINDS:
        raise _fail("response_format.type", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    extra = sorted(set(value) - {"type", kind})
    if extra:
        raise _fail("response_format", f"unknown field(s) {extra} for type {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(kind)
    body = value.get(kind)
    if kind == "json_schema":
        return ResponseFormat(kind, _schema(body))
    if kind == "regex":
        if not isinstance(body, str) or not body:
            raise _fail("response_format.regex", "expected a non-empty pattern string")
        return ResponseFormat(kind, body)
    return ResponseFormat(kind, _choices(body))


def _schema(body: Any) -> dict:
    if not isinstance(body, dict):
        raise _fail("response_format.json_schema", "expected an object with a 'schema'")
    unknown = sorted(set(body) - {"name", "schema", "strict", "description"})
    if unknown:
        raise _fail("response_format.json_schema", f"unknown field(s) {unknown}")
    schema = body.get("schema")
    if not isinstance(schema, dict):
        raise _fail("response_format.json_schema.schema", "expected a JSON Schema object")
    return schema


def _choices(body: Any) -> tuple[str, ...]:
    if not isinstance(body, list) or not body:
        raise _fail("response_format.choices", "expected a non-empty list of strings")
    for i, choice in enumerate(body):
        if not isinstance(choice, str) or not choice:
            raise _fail(
                f"response_format.choices[{i}]", f"expected a non-empty string, got {choice!r}"
            )
    return tuple(body)


def choices_regex(choices: tuple[str, ...]) -> str:
    """A regex matching exactly one of `choices` (every regex metacharacter escaped)."""
    escaped = ("".join("\\" + c if c in _REGEX_SPECIAL else c for c in s) for s in choices)
    return "(" + "|".join(escaped) + ")"


def from_cli(json_schema: str | None, regex: str | None, choices: str | None) -> dict | None:
    """The `response_format` of `dlmrt generate --json-schema FILE | --regex R | --choices A,B`."""
    given = [
        n
        for n, v in (("--json-schema", json_schema), ("--regex", regex), ("--choices", choices))
        if v
    ]
    if len(given) > 1:
        raise ValueError(f"{' / '.join(given)}: give at most one of them")
    if json_schema:
        try:
            with open(json_schema, encoding="utf-8") as f:
                schema = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--json-schema: cannot read {json_schema} ({e})") from None
        return {"type": "json_schema", "json_schema": {"name": "cli", "schema": schema}}
    if regex:
        return {"type": "regex", "regex": regex}
    if choices:
        return {"type": "choices", "choices": [c for c in choices.split(",")]}
    return None
