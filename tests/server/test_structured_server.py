"""`response_format` through the server: json_schema via the official openai client (streamed and
not) on completions and chat, and 400s naming the part for what cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import serve_in_thread, write_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import dlmrt  # noqa: E402
from dlmrt.server.app import build_app  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["apples", "pears"]}},
    "required": ["answer", "unit"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


def _valid(text: str) -> bool:
    doc = json.loads(text)
    return (
        set(doc) == {"answer", "unit"}
        and type(doc["answer"]) is int
        and doc["unit"] in ("apples", "pears")
    )


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    path: Path = write_checkpoint(tmp_path_factory.mktemp("st") / "base")
    app = build_app(dlmrt.LLM(path, dtype="float32", device="cpu"), served_model_name="t")
    with serve_in_thread(app) as u:
        yield u


@pytest.fixture(scope="module")
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_chat_json_schema(client):
    msgs = [{"role": "user", "content": "How many apples?"}]
    out = client.chat.completions.create(
        model="t", messages=msgs, max_tokens=48, response_format=FORMAT
    )
    assert _valid(out.choices[0].message.content)
    stream = client.chat.completions.create(
        model="t", messages=msgs, max_tokens=48, response_format=FORMAT, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert _valid(text)


def test_completion_json_schema(client):
    out = client.completions.create(
        model="t", prompt="How many?", max_tokens=48, extra_body={"response_format": FORMAT}
    )
    assert _valid(out.choices[0].text)


@pytest.mark.parametrize(
    ("fmt", "max_tokens", "param_prefix"),
    [
        (
            {"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}},
            32,
            "response_format",
        ),
        ({"type": "regex", "regex": "(ab"}, 32, "response_format"),
        ({"type": "yaml"}, 32, "response_format.type"),
        (FORMAT, 3, "response_format"),  # no document fits 3 tokens
    ],
)
def test_bad_formats_are_400(url, fmt, max_tokens, param_prefix):
    body = {"prompt": "x", "max_tokens": max_tokens, "response_format": fmt}
    res = httpx.post(url + "/v1/completions", json=body)
    assert res.status_code == 400, res.text
    err = res.json()["error"]
    assert err["param"] == param_prefix and err["message"]


def test_text_format_still_accepted(url):
    res = httpx.post(
        url + "/v1/completions",
        json={"prompt": "x", "max_tokens": 4, "response_format": {"type": "text"}},
    )
    assert res.status_code == 200, res.text
