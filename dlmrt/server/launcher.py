"""Launcher: `dlmrt serve` — load the model once, then run the app under uvicorn until a signal.

SIGINT / SIGTERM: uvicorn stops accepting connections, the worker refuses queued requests (503) and
cancels the running one at its next round, open streams end, and the process exits with status 0.

No client holds the server for ever: a request's headers have a deadline (`header_deadline.py`),
its body one for each read and one for the whole (`limits.py`), an idle keep-alive connection is
closed after `KEEP_ALIVE_S`, and beyond `--max-connections` open connections uvicorn answers 503
(its `limit_concurrency`), so file descriptors stay bounded.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

log = logging.getLogger("dlmrt")
GRACE_S = 30  # uvicorn's backstop: tasks still running this long after a signal are cancelled
MAX_CONNECTIONS = 256  # open connections at most (more: 503); one request runs, --max-queue wait
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this long


def missing_dependencies() -> list[str]:
    return [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]


def serve_command(args: argparse.Namespace) -> int:
    """The `dlmrt serve` subcommand (arguments from `dlmrt.cli`)."""
    missing = missing_dependencies()
    if missing:
        print(
            f"dlmrt: error: `dlmrt serve` needs {' and '.join(missing)}: "
            "pip install 'dlmrt[serve]'",
            file=sys.stderr,
        )
        return 1
    if not 0 <= args.port <= 65535:
        raise ValueError(f"port: must be in [0, 65535], got {args.port}")
    if args.max_queue < 1:
        raise ValueError(f"max_queue: must be >= 1, got {args.max_queue}")
    if args.max_request_bytes < 1:
        raise ValueError(f"max_request_bytes: must be >= 1, got {args.max_request_bytes}")
    if args.max_connections < 1:
        raise ValueError(f"max_connections: must be >= 1, got {args.max_connections}")

    from dlmrt.config import EngineConfig
    from dlmrt.distributed.requests import root_only
    from dlmrt.flags import values
    from dlmrt.llm import LLM

    llm = LLM(**values(args, EngineConfig))
    # torchrun: rank 0 serves HTTP, the other ranks decode the requests it shares
    return root_only(llm, lambda: _serve(args, llm))


def _serve(args: argparse.Namespace, llm: Any) -> int:
    import uvicorn

    from dlmrt.server.app import build_app

    app = build_app(
        llm,
        served_model_name=args.served_model_name,
        max_queue=args.max_queue,
        max_request_bytes=args.max_request_bytes,
    )
    config = uvicorn_config(uvicorn, app, args)
    name, queue = app.state.info.name, args.max_queue
    server = _server_class(uvicorn)(
        config, app.state.worker, lambda port: serving_line(name, args.host, port, queue)
    )
    # uvicorn re-raises the signal it caught once it has shut down; with these no-op handlers
    # installed that re-raise is harmless, so a graceful shutdown exits with status 0.
    previous = {s: signal.signal(s, _ignore) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits with status 3 when it cannot bind (logged above)
        print(f"dlmrt: error: could not serve on {args.host}:{args.port}", file=sys.stderr)
        return e.code if isinstance(e.code, int) and e.code else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def uvicorn_config(uvicorn: Any, app: Any, args: argparse.Namespace) -> Any:
    """The `uvicorn.Config` of `dlmrt serve`: the bounds of the module docstring."""
    from dlmrt.server.header_deadline import header_deadline_protocol

    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info" if args.verbose else "warning",
        access_log=args.verbose,
        timeout_graceful_shutdown=GRACE_S,
        http=header_deadline_protocol(),  # a slow or idle client's headers end in 408
        limit_concurrency=args.max_connections,
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def serving_line(name: str, host: str, port: int, max_queue: int) -> str:
    return f"dlmrt: serving {name!r} on http://{host}:{port}/v1 (queue {max_queue}); Ctrl-C stops"


def _ignore(signum: int, frame: Any) -> None:
    return None


def _server_class(uvicorn: Any) -> type:
    class GracefulServer(uvicorn.Server):
        """uvicorn.Server that also tells the worker to stop when a signal arrives, and prints
        `banner(port)` once the port is bound (not before: a port in use prints no "serving")."""

        def __init__(
            self, config: Any, worker: Any, banner: Callable[[int], str] | None = None
        ) -> None:
            super().__init__(config)
            self.worker, self.banner = worker, banner

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and self.banner is not None:
                port = self.servers[0].sockets[0].getsockname()[1] if self.servers else 0
                print(self.banner(port), file=sys.stderr, flush=True)

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.worker.begin_shutdown()  # a flag: safe inside a signal handler
            super().handle_exit(sig, frame)

    return GracefulServer
