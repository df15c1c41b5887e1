"""`response_format` through the server on DiffusionGemma's canvases: json_schema via the
official openai client, streamed and not, and a budget no document fits is a 400 (the schema and
its check: test_structured_server.py's)."""

from __future__ import annotations

import pytest
from conftest import serve_in_thread
from dg_helpers import byte_vocab_checkpoint
from test_structured_server import FORMAT, _valid, httpx, openai

import dlmrt
from dlmrt.server.app import build_app


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    path = byte_vocab_checkpoint(tmp_path_factory, 4)
    app = build_app(dlmrt.LLM(path, dtype="float32", device="cpu"), served_model_name="g")
    with serve_in_thread(app) as u:
        yield u


def test_completion_json_schema_streamed_and_not(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    kw = dict(model="g", prompt="How many?", max_tokens=48, extra_body={"response_format": FORMAT})
    assert _valid(client.completions.create(**kw).choices[0].text)
    stream = client.completions.create(**kw, stream=True)
    assert _valid("".join(c.choices[0].text for c in stream if c.choices))


def test_a_budget_no_document_fits_is_400(url):
    body = {"prompt": "x", "max_tokens": 3, "response_format": FORMAT}
    res = httpx.post(url + "/v1/completions", json=body)
    assert res.status_code == 400, res.text
    assert res.json()["error"]["param"] == "response_format"
