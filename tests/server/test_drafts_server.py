"""`dlmrt serve` with `"dlmrt": {"drafts": true}`: `event: draft` SSE events, one per round, equal
to the API's drafts; the rest of the stream as without the flag; the official `openai` client
keeps streaming; the playground page at `/`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import residual_config, serve_in_thread, write_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import dlmrt  # noqa: E402
from dlmrt.server.app import build_app  # noqa: E402

NAME = "tiny-orl"
PROMPT = "What is 12+30?"
KNOBS = {"max_tokens": 21, "ignore_eos": True, "rule": "threshold", "threshold": 0.5}


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("drafts") / "orl", residual=residual_config())


@pytest.fixture(scope="module")
def ref(ckpt) -> dlmrt.LLM:
    return dlmrt.LLM(ckpt, dtype="float32", device="cpu", fold_commits=False)


@pytest.fixture(scope="module")
def url(ckpt):
    # Unfolded like a request with drafts, so that the plain streams compare token for token.
    llm = dlmrt.LLM(ckpt, dtype="float32", device="cpu", fold_commits=False)
    with serve_in_thread(build_app(llm, served_model_name=NAME)) as base:
        yield base


def _events(url: str, path: str, body: dict) -> list[tuple[str, str]]:
    """(event name, data) of every SSE event of a streamed request, in order."""
    events = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for raw in r.read().decode().split("\n\n"):
            if not raw:
                continue
            lines = raw.split("\n")
            name = lines[0][len("event: ") :] if lines[0].startswith("event: ") else "message"
            data = [x[len("data: ") :] for x in lines if x.startswith("data: ")]
            assert len(data) == 1, raw
            events.append((name, data[0]))
    return events


def _content(events) -> str:
    text = ""
    for _, data in events:
        if data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                text += choice.get("text") or choice.get("delta", {}).get("content") or ""
    return text


def _plain(events) -> list[dict]:
    """The non-draft events without the per-request fields and the usage chunk."""
    out = []
    for name, data in events:
        if name == "message" and data != "[DONE]":
            body = json.loads(data)
            if body["choices"]:
                out.append({k: v for k, v in body.items() if k not in ("id", "created")})
    return out


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_draft_events_are_the_api_drafts(url, ref, kind):
    if kind == "completion":
        path, body, prompt = "/v1/completions", {"prompt": PROMPT}, PROMPT
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}
        prompt = ref.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
    body = {**body, **KNOBS, "stream": True, "dlmrt": {"drafts": True}}
    events = _events(url, path, body)
    drafts = [json.loads(d) for name, d in events if name == "draft"]
    expected: list = []
    kw = {k: v for k, v in KNOBS.items() if k != "max_tokens"}
    out = ref.generate(prompt, max_new_tokens=21, on_round=expected.append, **kw)
    assert [d["dlmrt"]["draft"] for d in drafts] == [
        json.loads(json.dumps(e.to_dict(ref.tokenizer.decode))) for e in expected
    ]
    assert len(drafts) == sum(out.rounds_per_block) > len(out.rounds_per_block)
    assert _content(events) == out.text  # draft chunks carry no content: the text is unchanged
    last = drafts[-1]["dlmrt"]["draft"]
    assert last["final"] and last["committed_text"] + last["text"] == out.text
    plain = _events(url, path, {k: v for k, v in body.items() if k != "dlmrt"})
    assert all(name == "message" for name, _ in plain)  # no draft events without the flag
    # the same text; without drafts it streams by rounds (docs/streaming.md), so in as many
    # chunks or more (a request with drafts streams its text a block at a time, after its drafts)
    assert _content(plain) == _content(events)
    assert len(_plain(plain)) >= len(_plain(events))


def test_draft_events_come_before_their_block_text(url):
    body = {"prompt": PROMPT, **KNOBS, "stream": True, "dlmrt": {"drafts": True}}
    events = _events(url, "/v1/completions", body)
    seen_final = False
    for name, data in events:
        if name == "draft":
            seen_final = json.loads(data)["dlmrt"]["draft"]["final"]
        elif data != "[DONE]" and _content([(name, data)]):
            assert seen_final  # a block's committed text follows its final draft


def test_drafts_need_a_stream(url):
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "dlmrt": {"drafts": True}})
    assert r.status_code == 400 and "stream" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "dlmrt": {"draft": True}})
    assert r.status_code == 400 and "dlmrt" in r.json()["error"]["message"]


def test_openai_client_streams_with_drafts(url, ref):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        max_tokens=21,
        extra_body={
            "dlmrt": {"drafts": True},
            **{k: v for k, v in KNOBS.items() if k != "max_tokens"},
        },
    )
    text, drafts = "", 0
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        extra = (chunk.model_extra or {}).get("dlmrt")
        drafts += bool(extra and "draft" in extra)
    full = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=21,
        extra_body={k: v for k, v in KNOBS.items() if k != "max_tokens"},
    )
    assert text == full.choices[0].message.content and drafts > 1


def test_the_playground_page(url):
    r = httpx.get(url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "dlmrt: {drafts: true}" in page and 'id="replay"' in page
    assert "http://" not in page and "https://" not in page  # no CDN: nothing loaded from outside


def test_diffusion_gemma_draft_events(tmp_path_factory):
    """The encoder-decoder style: one draft per denoising step, equal to the API's, text unchanged."""
    pytest.importorskip("transformers.models.diffusion_gemma")
    from dg_helpers import tiny_checkpoint

    path = tiny_checkpoint(tmp_path_factory)[0]
    llm = dlmrt.LLM(path, dtype="float32", device="cpu")
    knobs = {"seed": 3, "ignore_eos": True}
    expected: list = []
    out = llm.generate("ab", max_new_tokens=12, on_round=expected.append, **knobs)
    with serve_in_thread(build_app(dlmrt.LLM(path, dtype="float32", device="cpu"))) as base:
        body = {"prompt": "ab", "max_tokens": 12, "stream": True, "dlmrt": {"drafts": True}}
        events = _events(base, "/v1/completions", {**body, **knobs})
    drafts = [json.loads(d)["dlmrt"]["draft"] for name, d in events if name == "draft"]
    assert drafts == [json.loads(json.dumps(e.to_dict(llm.tokenizer.decode))) for e in expected]
    assert len(drafts) == out.num_denoising_forwards and _content(events) == out.text
