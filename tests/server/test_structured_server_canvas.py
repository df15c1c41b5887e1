"""`response_format` through the server on DiffusionGemma's canvases: json_schema via the
official openai client, streamed and not, and a budget no document fits is a 400."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import EOS_ID, serve_in_thread
from dg_helpers import _config, _randomise, dg, save_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import dlmrt  # noqa: E402
from dlmrt.server.app import build_app  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "unit": {"enum": ["apples", "pears"]}},
    "required": ["n", "unit"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    torch.manual_seed(0)
    hf = dg.DiffusionGemmaForBlockDiffusion(_config(vocab_size=260)).eval()
    _randomise(hf, 4)
    path = save_checkpoint(hf, tmp_path_factory.mktemp("dgserve") / "g")
    gen = json.loads((path / "generation_config.json").read_text())
    gen.update(eos_token_id=[EOS_ID], pad_token_id=EOS_ID)
    (path / "generation_config.json").write_text(json.dumps(gen))
    app = build_app(dlmrt.LLM(path, dtype="float32", device="cpu"), served_model_name="g")
    with serve_in_thread(app) as u:
        yield u


def _valid(text: str) -> bool:
    doc = json.loads(text)
    return (
        set(doc) == {"n", "unit"}
        and type(doc["n"]) is int
        and doc["unit"] in SCHEMA["properties"]["unit"]["enum"]
    )


def test_completion_json_schema_streamed_and_not(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    kw = dict(model="g", prompt="How many?", max_tokens=40, extra_body={"response_format": FORMAT})
    assert _valid(client.completions.create(**kw).choices[0].text)
    stream = client.completions.create(**kw, stream=True)
    assert _valid("".join(c.choices[0].text for c in stream if c.choices))


def test_a_budget_no_document_fits_is_400(url):
    body = {"prompt": "x", "max_tokens": 3, "response_format": FORMAT}
    res = httpx.post(url + "/v1/completions", json=body)
    assert res.status_code == 400, res.text
    assert res.json()["error"]["param"] == "response_format"
