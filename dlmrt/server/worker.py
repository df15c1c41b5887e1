"""Worker: the one thread that runs the engine, fed by a bounded FIFO of jobs.

The engine is single-threaded and serves one request at a time. A job is cancelled between rounds
(the engine polls `should_stop`; between blocks in block_graph mode) when its client disconnects or
the server shuts down; the next request starts clean because each request reloads the engine's buffers
(what it keeps of a cancelled one is only the K/V rows that request committed: docs/prefix-reuse.md).
Whatever a request raises, the worker answers it with an error event and takes the next job.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlmrt.detokenizer import IncrementalText
from dlmrt.drafts import Draft
from dlmrt.errors import GenerationCancelled
from dlmrt.server.metrics import Metrics
from dlmrt.server.protocol import APIError, RequestSpec

log = logging.getLogger("dlmrt")
CLIENT_CLOSED = 499  # nginx's "client closed request": counted, never sent


class Cancelled(Exception):
    """Raised from `on_progress` to stop the running request between blocks."""


class _StopString(Exception):
    """Raised from `on_progress` once a stop string has been generated."""


@dataclass
class Result:
    text: str
    finish_reason: str
    completion_tokens: int
    denoising_forwards: int
    request_time_s: float  # engine time: tokenisation of ids, prefill, decoding, host overhead
    queue_time_s: float
    seq: int  # admission order
    start_seq: int  # engine start order
    cached_tokens: int = 0  # prompt tokens an earlier request's K/V served (prefix reuse)

    def stats(self) -> dict[str, Any]:
        """The `dlmrt` extension object of a response."""
        return {
            "denoising_forwards": self.denoising_forwards,
            "tokens_per_forward": self.completion_tokens / max(self.denoising_forwards, 1),
            "request_time_s": self.request_time_s,
            "queue_time_s": self.queue_time_s,
            "seq": self.seq,
            "start_seq": self.start_seq,
        }


@dataclass(eq=False)
class Job:
    """One admitted request. `emit` must be thread-safe: the worker thread calls it."""

    spec: RequestSpec
    emit: Callable[[tuple], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    seq: int = 0
    admitted_at: float = 0.0

    def cancel(self) -> None:
        self.cancelled.set()


class Worker:
    def __init__(self, llm: Any, max_queue: int, metrics: Metrics) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue: must be >= 1, got {max_queue}")
        self.llm, self.metrics = llm, metrics
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="dlmrt-engine", daemon=True)
        self.closing = False
        self.running: Job | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=4096)  # one row per finished job
        self._finished = itertools.count(1)

    def start(self) -> None:
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        """Admit `job` in FIFO order, or raise APIError 503 (queue full or shutting down)."""
        with self._lock:
            if self.closing:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            if self._queue.full():
                wait = math.ceil(self.metrics.mean_latency() * (self._queue.qsize() + 1))
                raise APIError(
                    503,
                    f"the request queue is full ({self._queue.maxsize} waiting); retry later",
                    code="queue_full",
                    headers={"Retry-After": str(min(max(wait, 1), 3600))},
                )
            job.seq, job.admitted_at = self.metrics.count_admitted(), time.perf_counter()
            self._queue.put_nowait(job)  # cannot fail: only this lock's holder puts

    def begin_shutdown(self) -> None:
        """Refuse new jobs, fail the queued ones and cancel the running one at its next block.

        Safe to call from a signal handler: it only sets a flag that the worker thread reads.
        """
        self.closing = True

    def stop(self, timeout: float = 30.0) -> None:
        self.begin_shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=0.05)
            except queue.Empty:
                with self._lock:  # submit() checks `closing` under this lock: nothing is lost
                    if self.closing and self._queue.empty():
                        return
                continue
            if self.closing:
                self._fail(job, APIError(503, "the server is shutting down", code="shutting_down"))
            elif job.cancelled.is_set():
                self._record(job, CLIENT_CLOSED, 0)
            else:
                self._run_safely(job)

    def _run_safely(self, job: Job) -> None:
        try:
            self._run(job)
        except Exception as e:  # the worker must survive anything a request does
            log.exception("request %s failed", job.spec.request_id)
            status = 400 if isinstance(e, ValueError | TypeError) else 500
            self._fail(job, APIError(status, f"{type(e).__name__}: {e}"))
        finally:
            self.running = None

    def _run(self, job: Job) -> None:
        start_seq = self.metrics.count_started()
        self.running, t0 = job, time.perf_counter()
        spec = job.spec
        text = IncrementalText(self.llm.tokenizer.decode, spec.stop)
        seen = {"rounds": 0, "tokens": []}

        def stop_requested() -> bool:  # polled by the engine between rounds
            return job.cancelled.is_set() or self.closing

        on_progress, on_tokens = self._callbacks(job, text, seen)
        try:
            on_round = self._draft_events(job) if spec.drafts else None
            out = self.llm.generate(
                spec.prompt_ids,
                on_progress=on_progress,
                should_stop=stop_requested,
                on_round=on_round,
                on_tokens=on_tokens,
                params=spec.params,
            )
            reason, tokens, forwards = out.finish_reason, out.token_ids, out.num_denoising_forwards
        except _StopString:
            reason, tokens, forwards = "stop", seen["tokens"], seen["rounds"]
        except (Cancelled, GenerationCancelled):
            self._observe(job, len(seen["tokens"]), seen["rounds"])
            if job.cancelled.is_set():  # nobody is listening any more
                self._fail(job, APIError(503, "the client disconnected"), CLIENT_CLOSED)
            else:
                self._fail(job, APIError(503, "the server shut down during the request"))
            return
        delta = text.update(tokens, final=True)
        if delta and spec.stream:
            job.emit(("delta", delta))
        finished = time.perf_counter()
        used = text.tokens_until_stop(tokens) if text.stopped else len(tokens)
        result = Result(
            text=text.text,
            finish_reason=reason,
            completion_tokens=used,  # tokens decoded past a stop string are not counted
            denoising_forwards=forwards,
            request_time_s=finished - t0,
            queue_time_s=t0 - job.admitted_at,
            seq=job.seq,
            start_seq=start_seq,
            cached_tokens=_cached_tokens(self.llm),  # also when a stop string ended it
        )
        self._observe(job, len(tokens), forwards)
        self._record(job, 200, start_seq)
        job.emit(("done", result))

    def _callbacks(self, job: Job, text: IncrementalText, seen: dict) -> tuple:
        """(on_progress, on_tokens) of a request: rounds counted and cancellation checked after
        each block; the text streamed and stop strings found as tokens become final (None when
        the request neither streams nor has stop strings)."""

        def on_progress(index: int, rounds: int, tokens: list[int]) -> None:
            seen["rounds"] += rounds
            seen["tokens"] = tokens
            if job.cancelled.is_set() or self.closing:
                raise Cancelled

        def on_tokens(tokens: list[int]) -> None:  # every round, as rows become final
            seen["tokens"] = tokens
            delta = text.update(tokens)
            if delta and job.spec.stream:
                job.emit(("delta", delta))
            if text.stopped:
                raise _StopString

        return on_progress, on_tokens if job.spec.stream or job.spec.stop else None

    def _draft_events(self, job: Job) -> Callable[[Draft], None]:
        """An `on_round` that emits each draft as a `draft` event (before its block's text). The
        committed text is decoded once per block: a block's drafts share their prefix."""
        decode = self.llm.tokenizer.decode
        committed: dict[int, str] = {}

        def on_round(draft: Draft) -> None:
            if draft.block not in committed:
                committed.clear()
                committed[draft.block] = decode(list(draft.prefix))
            job.emit(("draft", draft.to_dict(decode, committed[draft.block])))

        return on_round

    def _observe(self, job: Job, tokens: int, forwards: int) -> None:
        latency = time.perf_counter() - job.admitted_at
        self.metrics.observe(len(job.spec.prompt_ids), tokens, forwards, latency)

    def _fail(self, job: Job, error: APIError, status: int | None = None) -> None:
        self._record(job, status or error.status, 0)
        error.counted = True
        job.emit(("error", error))

    def _record(self, job: Job, status: int, start_seq: int) -> None:
        self.metrics.count_status(status)
        row = {"id": job.spec.request_id, "seq": job.seq, "start_seq": start_seq}
        self.history.append({**row, "status": status, "finished": next(self._finished)})


def _cached_tokens(llm: Any) -> int:
    """The prompt tokens the latest request reused (its output's `num_cached_tokens`), read from
    the engine, which has it also for a request that a stop string ended before it returned:
    `engine.prefix` (both styles; an engine without one reuses none)."""
    prefix = getattr(llm.engine, "prefix", None)
    return 0 if prefix is None else prefix.reused
