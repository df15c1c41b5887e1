"""The FastAPI application: OpenAI-compatible routes in front of the single engine worker.

/v1/completions and /v1/chat/completions (SSE with `stream=true`, ending with `data: [DONE]`; with
`"dlmrt": {"drafts": true}` also `event: draft` events), /v1/models, /health, /metrics and the
playground page at / (`page.py`). Every error is an OpenAI-style JSON body with a 4xx status for bad
input, 503 (with Retry-After) when the queue is full; never a bare 500 for a client mistake.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from dlmrt import __version__
from dlmrt.server import protocol, responses
from dlmrt.server.limits import (
    BODY_DEADLINE_S,
    BODY_TIMEOUT_S,
    DEFAULT_MAX_REQUEST_BYTES,
    BodyLimit,
    BodyTimeout,
)
from dlmrt.server.metrics import Metrics
from dlmrt.server.page import page_html
from dlmrt.server.protocol import APIError, ModelInfo, RequestSpec
from dlmrt.server.worker import CLIENT_CLOSED, Job, Worker

log = logging.getLogger("dlmrt")
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
DISCONNECT_POLL_S = 0.25  # how often a waiting non-streamed request checks its client


def build_app(
    llm: Any,
    *,
    served_model_name: str | None = None,
    max_queue: int = 8,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    body_timeout_s: float = BODY_TIMEOUT_S,
    body_deadline_s: float = BODY_DEADLINE_S,
) -> FastAPI:
    """An app serving `llm` (a `dlmrt.LLM`); its worker thread runs while the app's lifespan does.

    Bodies over `max_request_bytes` are answered 413 before they are read; a body stalled for
    `body_timeout_s`, or not complete within `body_deadline_s`, 408."""
    metrics = Metrics()
    worker = Worker(llm, max_queue, metrics)
    cfg = llm.model_config
    info = ModelInfo(
        name=served_model_name or Path(llm.path).name,
        tokenizer=llm.tokenizer,
        vocab_size=cfg.vocab_size,
        block_size=getattr(cfg, "block_size", None),  # encoder-decoder models have canvases
        max_positions=cfg.max_position_embeddings,
        max_prompt_chars=cfg.max_position_embeddings * llm.tokenizer.longest_token_chars(),
        style=llm.style,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        yield
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="dlmrt", version=__version__, lifespan=lifespan)
    app.state.worker, app.state.metrics, app.state.info = worker, metrics, info
    app.state.created = int(time.time())
    _add_error_handlers(app, metrics)

    def rejected(scope: dict[str, Any]) -> None:
        if scope.get("path") in GENERATION_PATHS:
            metrics.count_status(413)

    app.add_middleware(
        BodyLimit,
        max_bytes=max_request_bytes,
        on_reject=rejected,
        body_timeout_s=body_timeout_s,
        body_deadline_s=body_deadline_s,
    )
    _add_generation_routes(app, worker, info)
    _add_info_routes(app, worker, metrics, info)
    return app


def _add_generation_routes(app: FastAPI, worker: Worker, info: ModelInfo) -> None:
    @app.post("/v1/completions")
    async def completions(body: protocol.CompletionRequest, request: Request) -> Response:
        # Tokenizing (and the chat template) runs off the event loop: /health stays responsive.
        spec = await asyncio.to_thread(protocol.completion_spec, body, info)
        return await _serve(worker, spec, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: protocol.ChatCompletionRequest, request: Request) -> Response:
        spec = await asyncio.to_thread(protocol.chat_spec, body, info)
        return await _serve(worker, spec, request)


def _add_info_routes(app: FastAPI, worker: Worker, metrics: Metrics, info: ModelInfo) -> None:
    def model_card() -> dict[str, Any]:
        return {
            "id": info.name,
            "object": "model",
            "created": app.state.created,
            "owned_by": "dlmrt",
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        protocol.check_model(model, info)
        return model_card()

    @app.get("/", include_in_schema=False)
    async def playground() -> Response:
        return HTMLResponse(page_html())

    @app.get("/health")
    async def health() -> Response:
        if worker.closing:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        text = metrics.render(worker.queue_depth, int(worker.running is not None))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def _serve(worker: Worker, spec: RequestSpec, request: Request) -> Response:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple] = asyncio.Queue()

    def emit(event: tuple) -> None:  # called from the worker thread
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass

    job = Job(spec, emit)
    worker.submit(job)  # APIError 503 when full
    request_id = {"X-Request-Id": request.headers.get("x-request-id") or spec.request_id}
    if spec.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"} | request_id
        return StreamingResponse(
            _sse(spec, job, events), media_type="text/event-stream", headers=headers
        )
    response = await _wait(spec, job, events, request)
    response.headers.update(request_id)
    return response


async def _wait(spec: RequestSpec, job: Job, events: asyncio.Queue, request: Request) -> Response:
    """The non-streamed answer; checks the client every DISCONNECT_POLL_S while it waits."""
    getter: asyncio.Future | None = None
    try:
        while True:
            getter = getter or asyncio.ensure_future(events.get())
            done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
            if not done:
                if await request.is_disconnected():
                    return Response(status_code=CLIENT_CLOSED)  # nobody reads it
                continue
            (kind, value), getter = getter.result(), None
            if kind == "done":
                return JSONResponse(responses.response_body(spec, value))
            if kind == "error":
                raise value
    finally:
        if getter is not None:
            getter.cancel()
        job.cancel()  # a no-op once it finished; else the worker drops it or stops it


async def _sse(spec: RequestSpec, job: Job, events: asyncio.Queue) -> AsyncIterator[str]:
    """Server-sent events; a client disconnect cancels this generator and so the job."""
    try:
        if spec.kind == "chat":
            yield _data(responses.chat_role_chunk(spec))
        while True:
            kind, value = await events.get()
            if kind == "delta":
                yield _data(responses.chunk_body(spec, value))
            elif kind == "draft":
                yield "event: draft\n" + _data(responses.draft_chunk(spec, value))
            elif kind == "done":
                yield _data(responses.chunk_body(spec, None, value.finish_reason))
                if spec.include_usage:
                    yield _data(responses.usage_chunk(spec, value))
                break
            else:
                yield _data(value.body())
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # a no-op once the job has finished


def _data(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    def answer(request: Request, error: APIError) -> JSONResponse:
        if request.url.path in GENERATION_PATHS and not error.counted:
            metrics.count_status(error.status)
        headers = dict(error.headers or {})
        if "x-request-id" in request.headers:  # echoed on errors too
            headers["X-Request-Id"] = request.headers["x-request-id"]
        return JSONResponse(error.body(), status_code=error.status, headers=headers or None)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc.errors())
        return answer(request, APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc.__cause__, BodyTimeout):  # too slow or idle a client: 408, and close
            # (the rest of its body would otherwise keep the connection until the header deadline)
            error = APIError(408, str(exc.__cause__), headers={"connection": "close"})
            return answer(request, error)
        if isinstance(exc.__cause__, ClientDisconnect):  # left mid-body: not a bad request
            if request.url.path in GENERATION_PATHS:
                metrics.count_status(CLIENT_CLOSED)
            return Response(status_code=CLIENT_CLOSED)  # nobody reads it
        error = APIError(exc.status_code, str(exc.detail), headers=exc.headers)
        return answer(request, error)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return answer(request, APIError(500, f"internal error: {type(exc).__name__}: {exc}"))


def validation_message(errors: Any) -> tuple[str, str | None]:
    """One clear sentence per offending field (a union reports each member: keep the first)."""
    parts: list[str] = []
    params: list[str] = []
    for err in errors:
        loc = [x for x in err.get("loc", ()) if x != "body"]
        kind = err.get("type", "")
        if kind == "json_invalid":
            detail = err.get("ctx", {}).get("error", err.get("msg", ""))
            return f"malformed JSON body: {detail}", None
        param = str(loc[0]) if loc else None
        if param in params:
            continue
        params.append(param)  # type: ignore[arg-type]
        where = (param or "") + "".join(f"[{x}]" for x in loc[1:] if isinstance(x, int))
        if kind == "extra_forbidden":
            parts.append(f"unrecognized request argument {where!r}")
        elif param is None:
            parts.append(f"request body: {err.get('msg', 'invalid')} (expected a JSON object)")
        else:
            parts.append(f"{where}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request", (params[0] if params else None)
