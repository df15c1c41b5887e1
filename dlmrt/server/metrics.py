"""Metrics: the server's counters, rendered in the Prometheus text exposition format (/metrics)."""

from __future__ import annotations

import threading
from collections import Counter

SERIES = {  # name (after the dlmrt_ prefix): (type, help)
    "requests_admitted_total": ("counter", "requests admitted to the queue"),
    "requests_started_total": ("counter", "requests started by the engine"),
    "prompt_tokens_total": ("counter", "prompt tokens of finished requests"),
    "generated_tokens_total": ("counter", "generated tokens"),
    "denoising_forwards_total": ("counter", "denoising forward passes"),
    "tokens_per_forward_last": ("gauge", "tokens per denoising forward of the last request"),
    "tokens_per_forward_avg": ("gauge", "generated tokens / denoising forwards, all requests"),
    "queue_depth": ("gauge", "requests waiting for the engine"),
    "requests_running": ("gauge", "requests running on the engine (0 or 1)"),
}


class Metrics:
    """Thread-safe counters: the event loop counts HTTP answers, the worker counts generations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # HTTP status of each generation request
        self.admitted = 0  # requests put in the queue (their admission sequence numbers)
        self.started = 0  # requests the engine started
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.denoising_forwards = 0
        self.latency_sum = 0.0  # seconds from admission until the engine is done with it
        self.latency_count = 0
        self.last_tokens_per_forward = 0.0

    def count_status(self, status: int | str) -> None:
        with self._lock:
            self.requests[str(status)] += 1

    def count_admitted(self) -> int:
        """Count one admitted request and return its sequence number (1, 2, ...)."""
        with self._lock:
            self.admitted += 1
            return self.admitted

    def count_started(self) -> int:
        with self._lock:
            self.started += 1
            return self.started

    def observe(self, prompt_tokens: int, tokens: int, forwards: int, latency_s: float) -> None:
        """One generation finished (completed, stopped or cancelled after some blocks)."""
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.generated_tokens += tokens
            self.denoising_forwards += forwards
            self.latency_sum += latency_s
            self.latency_count += 1
            if forwards:
                self.last_tokens_per_forward = tokens / forwards

    def mean_latency(self) -> float:
        with self._lock:
            return self.latency_sum / self.latency_count if self.latency_count else 0.0

    def render(self, queue_depth: int, running: int) -> str:
        with self._lock:
            tpf_avg = self.generated_tokens / max(self.denoising_forwards, 1)
            lines = _family("requests_total", "counter", "generation requests by HTTP status")
            for status, n in sorted(self.requests.items()):
                lines.append(f'dlmrt_requests_total{{status="{status}"}} {n}')
            values = {
                "requests_admitted_total": self.admitted,
                "requests_started_total": self.started,
                "prompt_tokens_total": self.prompt_tokens,
                "generated_tokens_total": self.generated_tokens,
                "denoising_forwards_total": self.denoising_forwards,
                "tokens_per_forward_last": self.last_tokens_per_forward,
                "tokens_per_forward_avg": float(tpf_avg),
                "queue_depth": queue_depth,
                "requests_running": running,
            }
            for name, (kind, help_text) in SERIES.items():
                lines += [*_family(name, kind, help_text), f"dlmrt_{name} {_num(values[name])}"]
            lines += _family("request_latency_seconds", "summary", "admission to the answer")
            lines.append(f"dlmrt_request_latency_seconds_sum {_num(self.latency_sum)}")
            lines.append(f"dlmrt_request_latency_seconds_count {self.latency_count}")
        return "\n".join(lines) + "\n"


def _family(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP dlmrt_{name} {help_text}", f"# TYPE dlmrt_{name} {kind}"]


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def parse(text: str) -> dict[str, float]:
    """Parse the exposition text back into {"name{labels}": value} (tests and examples)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out
