"""No client holds `dlmrt serve` for ever: a body trickled a byte at a time ends in 408 at the whole
body's deadline (each byte arriving within the per-read timeout used to keep the connection for
ever), and uvicorn runs with a connection cap (503 beyond it) and a keep-alive timeout."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import pytest
from conftest import serve_in_thread, write_checkpoint

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import dlmrt  # noqa: E402
from dlmrt.cli import build_parser  # noqa: E402
from dlmrt.server.app import build_app  # noqa: E402
from dlmrt.server.header_deadline import header_deadline_protocol  # noqa: E402
from dlmrt.server.launcher import KEEP_ALIVE_S, MAX_CONNECTIONS, uvicorn_config  # noqa: E402
from dlmrt.server.limits import BodyLimit  # noqa: E402


async def _echo(scope, receive, send) -> None:
    """An app that reads the whole body, then answers 200 with its length."""
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def _read_all(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(4096):  # until the server closes
        answer += chunk
    return answer


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> dlmrt.LLM:
    ckpt = write_checkpoint(tmp_path_factory.mktemp("bounds") / "m")
    return dlmrt.LLM(ckpt, dtype="float32", device="cpu")


def test_a_trickled_body_ends_at_the_whole_body_deadline(llm):
    """One byte every 0.2 s, each well within the 0.5 s read timeout: 408 at the 1.5 s deadline."""
    with serve_in_thread(build_app(llm, body_timeout_s=0.5, body_deadline_s=1.5)) as url:
        where = urlparse(url)
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n"
        )
        with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
            sock.sendall(head)
            t0 = time.monotonic()
            try:
                for _ in range(40):  # 8 s of trickling if nothing stops it
                    sock.sendall(b" ")
                    time.sleep(0.2)
                    if time.monotonic() - t0 > 2.5:
                        break
            except OSError:  # the server answered and closed while we were still sending
                pass
            answer = _read_all(sock)
            waited = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"not complete within 1.5 s" in answer
        assert 1.4 < waited < 5
        body = {"prompt": "1+1=", "max_tokens": 4}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200


@pytest.mark.parametrize("value", [0, float("nan"), float("inf")])
def test_the_body_deadline_must_be_positive_and_finite(value):
    with pytest.raises(ValueError, match="^body_deadline_s: must be"):
        BodyLimit(_echo, 1000, body_deadline_s=value)


def test_serve_caps_connections_and_idle_keep_alives():
    args = build_parser().parse_args(["serve", "--model", "m"])
    assert args.max_connections == MAX_CONNECTIONS
    config = uvicorn_config(uvicorn, _echo, args)
    assert config.limit_concurrency == MAX_CONNECTIONS
    assert config.timeout_keep_alive == KEEP_ALIVE_S
    assert config.http.__name__ == "HeaderDeadline"
    capped = build_parser().parse_args(["serve", "--model", "m", "--max-connections", "3"])
    assert uvicorn_config(uvicorn, _echo, capped).limit_concurrency == 3


def test_beyond_the_cap_a_request_gets_503():
    """Two idle connections fill a cap of 2: the next request is refused at once, not queued."""
    with serve_in_thread(_echo, limit_concurrency=2, http=header_deadline_protocol()) as url:
        where = urlparse(url)
        idle = [socket.create_connection((where.hostname, where.port)) for _ in range(2)]
        try:
            time.sleep(0.2)  # accepted by the server
            res = httpx.post(url, content=b"x", timeout=10)
            assert res.status_code == 503
        finally:
            for sock in idle:
                sock.close()
        time.sleep(0.2)
        assert httpx.post(url, content=b"xy", timeout=10).text == "2"


def test_cli_refuses_a_zero_connection_cap(tmp_path, capsys):
    from dlmrt.cli import main

    assert main(["serve", "--model", str(tmp_path), "--max-connections", "0"]) == 2
    assert "max_connections: must be >= 1, got 0" in capsys.readouterr().err
