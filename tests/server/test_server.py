"""`dlmrt serve`: a live uvicorn server on loopback with a tiny checkpoint, driven by the official
`openai` client (and httpx for raw HTTP). Outputs are compared with a separate `LLM` on the same
checkpoint (greedy decoding on the CPU is deterministic)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
from dlmrt.server.metrics import parse as parse_metrics  # noqa: E402

NAME = "tiny-orl"
PROMPT = "What is 12+30?"
LONG = {"block_length": 1, "ignore_eos": True}  # one forward per token: a slow request
MANY = 4000  # max_tokens of a request that is cancelled long before it could finish


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    # Spin-waiting OpenMP pools crawl when the (2-core) box is busy; tiny models need one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve")
    # A long context, so that a cancelled request could have run for seconds.
    return write_checkpoint(root / "orl", residual=residual_config(), max_position_embeddings=4096)


@pytest.fixture(scope="module")
def ref(ckpt) -> dlmrt.LLM:
    """The reference: an LLM of its own, never touched by the server's worker thread."""
    return dlmrt.LLM(ckpt, dtype="float32", device="cpu")


@contextmanager
def live_server(ckpt: Path, max_queue: int = 8) -> Iterator[tuple[str, object]]:
    """uvicorn serving a fresh LLM in a background thread on a free loopback port."""
    llm = dlmrt.LLM(ckpt, dtype="float32", device="cpu")
    app = build_app(llm, served_model_name=NAME, max_queue=max_queue)
    with serve_in_thread(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def server(ckpt):
    with live_server(ckpt) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=60)


def metrics(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(url + "/metrics").text)


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_models_list(client, server):
    """/v1/models lists the served name; /v1/models/<other> is a 404 in OpenAI's error format."""
    assert [m.id for m in client.models.list()] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    res = httpx.get(server[0] + "/v1/models/gpt-4")
    assert res.status_code == 404 and res.json()["error"]["code"] == "model_not_found"


def test_completion_matches_engine(client, ref):
    """A completion is the engine's greedy text, with usage and finish_reason from the engine."""
    out = ref.generate(PROMPT, max_new_tokens=12)
    res = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0)
    assert res.choices[0].text == out.text
    assert res.choices[0].finish_reason == out.finish_reason
    assert res.usage.prompt_tokens == out.prompt_tokens
    assert res.usage.completion_tokens == len(out.token_ids)
    assert res.usage.total_tokens == out.prompt_tokens + len(out.token_ids)
    stats = res.model_extra["dlmrt"]
    assert stats["denoising_forwards"] == out.num_denoising_forwards
    ids = ref.tokenizer.encode(PROMPT)
    by_ids = client.completions.create(model=NAME, prompt=ids, max_tokens=12)
    assert by_ids.choices[0].text == out.text


def test_chat_uses_template(client, ref):
    """Chat messages go through the checkpoint's chat template (system + user)."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    prompt = ref.tokenizer.apply_chat_template(messages)
    out = ref.generate(prompt, max_new_tokens=16)
    res = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16)
    assert res.choices[0].message.role == "assistant"
    assert res.choices[0].message.content == out.text
    assert res.usage.prompt_tokens == len(ref.tokenizer.encode(prompt))


def test_extra_body_decode_knobs(client, ref):
    """rule / threshold / block_length / ignore_eos extra fields reach DecodeParams."""
    knobs = {"rule": "threshold", "threshold": 0.5, "block_length": 4, "ignore_eos": True}
    out = ref.generate(PROMPT, max_new_tokens=20, **knobs)
    res = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=20, extra_body=knobs)
    assert res.choices[0].text == out.text and res.choices[0].finish_reason == "length"
    assert res.usage.completion_tokens == 20
    assert res.model_extra["dlmrt"]["denoising_forwards"] == out.num_denoising_forwards


def test_streaming_concatenates_to_text(client):
    """Streamed chunks (one per committed block) concatenate to the non-streamed greedy text."""
    kw = {"model": NAME, "prompt": PROMPT, "max_tokens": 40, "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**kw).choices[0].text
    chunks = list(
        client.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == full
    assert sum(1 for t in texts if t) >= 3  # 40 tokens over blocks of 8: several deltas
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 40


def test_chat_streaming_concatenates(client):
    messages = [{"role": "user", "content": "hello"}]
    kw = {"model": NAME, "messages": messages, "max_tokens": 30}
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}


def test_stop_string(client, ref):
    """`stop` cuts the text before the stop string (streamed or not), finish_reason 'stop'."""
    text = ref.generate(PROMPT, max_new_tokens=40, ignore_eos=True).text
    stop = next(c for c in text[2:] if c.isascii() and c.isalnum())
    expected = text[: text.index(stop)]
    kw = {"model": NAME, "prompt": PROMPT, "max_tokens": 40, "stop": [stop]}
    kw["extra_body"] = {"ignore_eos": True}
    res = client.completions.create(**kw)
    assert res.choices[0].text == expected and res.choices[0].finish_reason == "stop"
    # tokens up to the one that completes the stop string (byte tokens: one a character here),
    # not the rest of the block the engine committed
    assert res.usage.completion_tokens == text.index(stop) + 1
    streamed = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_concurrent_clients_fifo(server, client, ref):
    """8 concurrent clients queued behind a running request: all answered with their own text,
    none lost, run in admission (FIFO) order."""
    url, app = server
    prompts = [f"question {i}" for i in range(8)]
    sizes = [8, 24, 16, 8, 32, 16, 24, 8]
    results: dict[int, object] = {}

    def ask(i: int) -> None:
        results[i] = client.completions.create(model=NAME, prompt=prompts[i], max_tokens=sizes[i])

    blocker = client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=MANY, stream=True, extra_body=LONG
    )
    next(iter(blocker))  # the engine is busy: the 8 requests below all wait in the queue
    admitted = metrics(url)["dlmrt_requests_admitted_total"]
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for i, t in enumerate(threads):  # admit one by one, so the admission order is known
        t.start()
        wait_for(lambda i=i: metrics(url)["dlmrt_requests_admitted_total"] == admitted + i + 1)
    assert metrics(url)["dlmrt_queue_depth"] == 8 and not results
    blocker.close()  # frees the engine (cancelled at its next block)
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(8))  # none lost
    for i, res in results.items():
        assert res.choices[0].text == ref.generate(prompts[i], max_new_tokens=sizes[i]).text, i
    seqs = [results[i].model_extra["dlmrt"]["seq"] for i in range(8)]
    starts = [results[i].model_extra["dlmrt"]["start_seq"] for i in range(8)]
    assert seqs == list(range(int(admitted) + 1, int(admitted) + 9))
    assert starts == sorted(starts) and len(set(starts)) == 8  # FIFO: run in admission order
    rows = {r["id"]: r for r in app.state.worker.history}
    assert [rows[results[i].id]["finished"] for i in range(8)] == sorted(
        rows[results[i].id]["finished"] for i in range(8)
    )


def test_disconnect_mid_stream_frees_engine(server, client):
    """A client that drops its stream cancels the request at the next block (status 499)."""
    url, app = server
    before = metrics(url)
    stream = client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=MANY, stream=True, extra_body=LONG
    )
    first = next(iter(stream))
    assert first.choices[0].text is not None
    stream.close()
    t0 = time.monotonic()
    res = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8)
    assert res.choices[0].finish_reason in {"stop", "length"}
    assert time.monotonic() - t0 < 30
    after = metrics(url)
    assert after.get('dlmrt_requests_total{status="499"}', 0) == (
        before.get('dlmrt_requests_total{status="499"}', 0) + 1
    )
    generated = after["dlmrt_generated_tokens_total"] - before["dlmrt_generated_tokens_total"]
    assert generated < MANY + res.usage.completion_tokens  # the long one stopped early
    assert [r["status"] for r in app.state.worker.history][-2:] == [499, 200]


def test_disconnect_while_waiting_non_streamed(server):
    """A non-streamed request whose client gives up is cancelled too (the server polls)."""
    url, app = server
    before = metrics(url)
    body = {"prompt": PROMPT, "max_tokens": MANY, **LONG}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json=body, timeout=0.2)
    key = 'dlmrt_requests_total{status="499"}'
    wait_for(lambda: metrics(url).get(key, 0) == before.get(key, 0) + 1, what="cancellation")
    after = metrics(url)
    assert after["dlmrt_generated_tokens_total"] - before["dlmrt_generated_tokens_total"] < MANY
    assert after["dlmrt_requests_running"] == 0


def test_a_client_leaving_mid_body_is_499_not_400(server):
    """Headers announce 200 body bytes, 10 arrive, the client closes: counted as a disconnect."""
    import socket
    from urllib.parse import urlparse

    url, _app = server
    before = metrics(url)
    where = urlparse(url)
    with socket.create_connection((where.hostname, where.port)) as sock:
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Length: 200\r\n\r\n")  # fmt: skip
        sock.sendall(head.encode() + b'{"prompt":')
    key = 'dlmrt_requests_total{status="499"}'
    wait_for(lambda: metrics(url).get(key, 0) == before.get(key, 0) + 1, what="the 499")
    bad = 'dlmrt_requests_total{status="400"}'
    assert metrics(url).get(bad, 0) == before.get(bad, 0)


def test_queue_full_503(ckpt):
    """--max-queue 1: one running + one waiting; the next gets 503 with Retry-After."""
    with live_server(ckpt, max_queue=1) as (url, _app):
        body = {"prompt": PROMPT, "max_tokens": MANY, "stream": True, **LONG}
        with httpx.Client(base_url=url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as running:
                lines = running.iter_lines()  # keep it: a collected iterator closes the stream
                next(lines)
                wait_for(lambda: metrics(url)["dlmrt_requests_running"] == 1, what="running")
                waiting: dict[str, httpx.Response] = {}
                short = {"prompt": PROMPT, "max_tokens": 4}
                t = threading.Thread(
                    target=lambda: waiting.update(r=http.post("/v1/completions", json=short))
                )
                t.start()
                wait_for(lambda: metrics(url)["dlmrt_queue_depth"] == 1, what="queued")
                res = http.post("/v1/completions", json=short)
                assert res.status_code == 503
                assert int(res.headers["retry-after"]) >= 1
                assert res.json()["error"]["code"] == "queue_full"
            t.join(60)  # the running stream was dropped: the waiting request is served
            assert waiting["r"].status_code == 200
        m = metrics(url)
        assert m['dlmrt_requests_total{status="503"}'] == 1
        assert m['dlmrt_requests_total{status="499"}'] == 1


BAD_INPUTS = [
    ({"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "x" * 5000}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "8"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "temperature": 1e-39}, 400, "temperature"),  # not a 500 blaming the weights
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": [1, 99999]}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({}, 400, "prompt"),
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "unknown_field": 1}, 400, "unknown_field"),
    ({"prompt": "x", "threshold": 2.0}, 400, "threshold"),
    ({"prompt": "x", "rule": "nope"}, 400, "rule"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_INPUTS)
def test_bad_completion_inputs(server, body, status, param):
    """Each bad input is a 4xx with an OpenAI error body naming the parameter."""
    res = httpx.post(server[0] + "/v1/completions", json=body)
    assert res.status_code == status, res.text
    err = res.json()["error"]
    assert err["param"] == param and err["message"] and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b'{"prompt": "x",', 400),  # malformed JSON
        (b"[1, 2]", 400),  # not an object
        (b'{"messages": []}', 400),  # chat: no messages
        (b'{"messages": "hi"}', 400),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400),
        (b'{"messages": [{"content": "hi"}]}', 400),
    ],
)
def test_bad_chat_bodies(server, content, status):
    headers = {"content-type": "application/json"}
    res = httpx.post(server[0] + "/v1/chat/completions", content=content, headers=headers)
    assert res.status_code == status, res.text
    assert res.json()["error"]["message"]


def test_errors_leave_server_healthy(server, client):
    """After the bad inputs, the worker still serves; an unknown route is a JSON 404."""
    url = server[0]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=NAME, prompt="x", max_tokens=-3)
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    assert httpx.get(url + "/nope").status_code == 404
    res = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=4)
    assert res.usage.completion_tokens >= 1
    assert app_metrics_consistent(url)


def app_metrics_consistent(url: str) -> bool:
    m = metrics(url)
    tpf = m["dlmrt_generated_tokens_total"] / m["dlmrt_denoising_forwards_total"]
    return abs(m["dlmrt_tokens_per_forward_avg"] - tpf) < 1e-9


def test_metrics_count_a_request(server, client):
    """/metrics: requests, tokens, forwards, latency and TPF move by one request's numbers."""
    url = server[0]
    before = metrics(url)
    res = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24)
    after = metrics(url)
    forwards = res.model_extra["dlmrt"]["denoising_forwards"]
    tokens = res.usage.completion_tokens
    key = 'dlmrt_requests_total{status="200"}'
    assert after[key] == before.get(key, 0) + 1  # the first 200 of this server, or not
    assert after["dlmrt_generated_tokens_total"] - before["dlmrt_generated_tokens_total"] == tokens
    assert after["dlmrt_denoising_forwards_total"] - before["dlmrt_denoising_forwards_total"] == (
        forwards
    )
    assert after["dlmrt_request_latency_seconds_count"] == (
        before["dlmrt_request_latency_seconds_count"] + 1
    )
    assert after["dlmrt_tokens_per_forward_last"] == pytest.approx(tokens / forwards)
    assert after["dlmrt_queue_depth"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("dlmrt") is None, reason="console script not installed")
def test_cli_serve_graceful_shutdown(ckpt, tmp_path):
    """`dlmrt serve`: SIGTERM mid-stream ends the stream with an error event and exits 0."""
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = ["dlmrt", "serve", "--model", str(ckpt), "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--served-model-name", "cli-model", "--max-queue", "2"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url, proc), timeout=60, what="dlmrt serve")
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "cli-model"
        body = {"prompt": PROMPT, "max_tokens": MANY, "stream": True, **LONG}
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as res:
            lines = (ln for ln in res.iter_lines() if ln.startswith("data: "))
            events.append(next(lines))
            proc.send_signal(signal.SIGTERM)
            events += list(lines)
        assert events[-1] == "data: [DONE]"
        assert "shut down" in json.loads(events[-2][6:])["error"]["message"]
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _healthy(url: str, proc: subprocess.Popen) -> bool:
    assert proc.poll() is None, proc.stderr.read()
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_diffusion_gemma_served(tmp_path):
    """A DiffusionGemma checkpoint serves: the canvas decoder's knobs arrive as extra fields and
    the text equals a separate LLM's (same seed, torch RNG)."""
    from dg_helpers import SETTINGS

    pytest.importorskip("transformers.models.diffusion_gemma")
    import transformers.models.diffusion_gemma as dg
    from conftest import _byte_tokenizer
    from dg_helpers import _config, _randomise

    torch.manual_seed(0)
    hf = dg.DiffusionGemmaForBlockDiffusion(_config()).eval()
    _randomise(hf, 1)
    hf.save_pretrained(tmp_path / "dg")
    _byte_tokenizer().save(str(tmp_path / "dg" / "tokenizer.json"))
    knobs = {**SETTINGS[2], "seed": 3, "ignore_eos": True}
    out = dlmrt.LLM(tmp_path / "dg", dtype="float32", device="cpu").generate(
        "ab", max_new_tokens=12, **knobs
    )
    with live_server(tmp_path / "dg") as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        res = client.completions.create(model=NAME, prompt="ab", max_tokens=12, extra_body=knobs)
        assert res.choices[0].text == out.text and res.usage.completion_tokens == 12
        bad = httpx.post(url + "/v1/completions", json={"prompt": "ab", "rule": "threshold"})
        assert bad.status_code == 400 and "does not apply" in bad.json()["error"]["message"]
