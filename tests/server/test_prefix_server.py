"""`usage.prompt_tokens_details.cached_tokens` (OpenAI's field): the prompt tokens a request reused
from the arena (prefix reuse, docs/prefix-reuse.md), blocking and streamed, and when a stop string
ends the request early. The expected counts follow from the block layout alone: a request that ran
to its length leaves every block but its last committed."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import residual_config, serve_in_thread, write_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import dlmrt  # noqa: E402
from dlmrt.blocks import layout  # noqa: E402
from dlmrt.server.app import build_app  # noqa: E402

B, NEW = 8, 20  # the tiny checkpoint's block size; max_tokens of every request
BODY = {"model": "tiny", "max_tokens": NEW, "ignore_eos": True}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)  # tiny models on a busy 2-core box
    path = write_checkpoint(
        tmp_path_factory.mktemp("prefix-serve") / "orl", residual=residual_config()
    )
    ref = dlmrt.LLM(path, dtype="float32", device="cpu", prefix_reuse=False)
    app = build_app(dlmrt.LLM(path, dtype="float32", device="cpu"), served_model_name="tiny")
    with serve_in_thread(app) as url:
        yield url, ref


def _committed(prompt_len: int) -> int:
    return (layout(prompt_len, NEW, B).num_blocks - 1) * B


def _complete(url: str, prompt: list[int], **extra) -> dict:
    res = httpx.post(url + "/v1/completions", json={**BODY, "prompt": prompt, **extra}, timeout=120)
    assert res.status_code == 200, res.text
    return res.json()


def _stream_usage(url: str, prompt: list[int]) -> tuple[str, dict]:
    body = {**BODY, "prompt": prompt, "stream": True, "stream_options": {"include_usage": True}}
    text, usage = "", None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as res:
        for line in res.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            text += "".join(c["text"] for c in chunk["choices"])
            usage = chunk.get("usage") or usage
    return text, usage


def test_cached_tokens_blocking_and_streamed(setup):
    url, ref = setup
    first = [(29 * i + 7) % 200 + 3 for i in range(2 * B + 3)]
    body = _complete(url, first)
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    out = ref.generate(first, max_new_tokens=NEW, ignore_eos=True)
    assert body["choices"][0]["text"] == out.text
    second = first + out.token_ids + [65, 66, 67, 68, 69]
    body = _complete(url, second)
    want = min(_committed(len(first)), len(second) // B * B)
    assert want == 4 * B and body["usage"]["prompt_tokens_details"]["cached_tokens"] == want
    assert body["usage"]["prompt_tokens"] == len(second)
    assert (
        body["choices"][0]["text"] == ref.generate(second, max_new_tokens=NEW, ignore_eos=True).text
    )
    text, usage = _stream_usage(url, second)  # the same prompt again: all its full blocks
    assert usage["prompt_tokens_details"]["cached_tokens"] == len(second) // B * B
    assert text == body["choices"][0]["text"]


def test_cached_tokens_when_a_stop_string_ends_the_request(setup):
    """A stop string ends the request by raising from its progress callback, so the engine
    returns no output: the count comes from the engine's record of the request."""
    url, ref = setup
    prompt = [(31 * i + 5) % 200 + 3 for i in range(3 * B + 2)]
    _complete(url, prompt)  # the request the next one reuses
    follow = prompt + ref.generate(prompt, max_new_tokens=NEW, ignore_eos=True).token_ids + [70] * 6
    full = ref.generate(follow, max_new_tokens=NEW, ignore_eos=True).text
    # any character of the output: the callback that sees it raises (whichever block it is in)
    stop = next((c for c in full if c.isascii() and c.isprintable()), None)
    assert stop is not None, f"no usable stop character in {full!r}"
    body = _complete(url, follow, stop=[stop])
    assert body["choices"][0]["finish_reason"] == "stop"
    want = min(_committed(len(prompt)), len(follow) // B * B)
    assert want == 5 * B and body["usage"]["prompt_tokens_details"]["cached_tokens"] == want
