"""Launcher: `dlmrt serve` — load the model once, then run the app under uvicorn until a signal.

SIGINT / SIGTERM: uvicorn stops accepting connections, the worker refuses queued requests (503) and
cancels the running one at its next round, open streams end, and the process exits with status 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import signal
import sys
from typing import Any

log = logging.getLogger("dlmrt")
GRACE_S = 30  # uvicorn's backstop: tasks still running this long after a signal are cancelled


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

    import uvicorn

    from dlmrt.config import EngineConfig
    from dlmrt.flags import values
    from dlmrt.llm import LLM
    from dlmrt.server.app import build_app

    llm = LLM(**values(args, EngineConfig))
    app = build_app(
        llm,
        served_model_name=args.served_model_name,
        max_queue=args.max_queue,
        max_request_bytes=args.max_request_bytes,
    )
    level = "info" if args.verbose else "warning"
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=level,
        access_log=args.verbose,
        timeout_graceful_shutdown=GRACE_S,
    )
    server = _server_class(uvicorn)(config, app.state.worker)
    print(
        f"dlmrt: serving {app.state.info.name!r} on http://{args.host}:{args.port}/v1 "
        f"(queue {args.max_queue}); Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn re-raises the signal it caught once it has shut down; with these no-op handlers
    # installed that re-raise is harmless, so a graceful shutdown exits with status 0.
    previous = {s: signal.signal(s, _ignore) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _ignore(signum: int, frame: Any) -> None:
    return None


def _server_class(uvicorn: Any) -> type:
    class GracefulServer(uvicorn.Server):
        """uvicorn.Server that also tells the worker to stop when a signal arrives."""

        def __init__(self, config: Any, worker: Any) -> None:
            super().__init__(config)
            self.worker = worker

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.worker.begin_shutdown()  # a flag: safe inside a signal handler
            super().handle_exit(sig, frame)

    return GracefulServer
