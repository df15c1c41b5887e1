"""`dlmrt serve`'s "serving on ..." line is printed once uvicorn has bound the port (with the port it
bound), and never when binding fails (no model is loaded: a bare ASGI app)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")

from dlmrt.server.launcher import _server_class, serving_line  # noqa: E402


class _Worker:
    def begin_shutdown(self) -> None:
        pass


async def _app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})


def _server(port: int):
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, log_level="critical")
    banner = lambda p: serving_line("m", "127.0.0.1", p, 8)  # noqa: E731
    return _server_class(uvicorn)(config, _Worker(), banner)


def test_serving_line_after_bind_with_the_bound_port(capfd):
    server = _server(0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    thread.join(20)
    err = capfd.readouterr().err
    assert port != 0 and f"dlmrt: serving 'm' on http://127.0.0.1:{port}/v1 (queue 8)" in err


def test_no_serving_line_when_the_port_is_taken(capfd):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = _server(taken.getsockname()[1])
        with pytest.raises(SystemExit):
            server.run()
    assert not server.started and "serving" not in capfd.readouterr().err


def test_cli_serve_on_a_taken_port(tmp_path, capfd):
    """`dlmrt serve --port N` with N in use: an error naming the address, no "serving" line."""
    from conftest import write_checkpoint

    from dlmrt.cli import main

    ckpt = write_checkpoint(tmp_path / "m")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--model", str(ckpt), "--host", "127.0.0.1", "--port", str(port)]
        assert main([*args, "--device", "cpu"]) == 3
    err = capfd.readouterr().err
    assert "serving" not in err and f"dlmrt: error: could not serve on 127.0.0.1:{port}" in err
