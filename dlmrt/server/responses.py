"""Response bodies: OpenAI completion / chat answers and their streamed chunks.

Each answer carries the OpenAI fields plus a `dlmrt` extension object (denoising forwards, tokens
per forward, request and queue time, admission and start sequence numbers).
"""

from __future__ import annotations

from typing import Any

from dlmrt.server.protocol import RequestSpec


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens`: the prompt tokens whose K/V
    an earlier request left in the arena (prefix reuse, docs/prefix-reuse.md)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def response_body(spec: RequestSpec, result: Any) -> dict[str, Any]:
    """The non-streamed answer; `result` is a worker `Result`."""
    if spec.kind == "completion":
        choice = {"index": 0, "text": result.text, "logprobs": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text}}
        choice["logprobs"] = None
        obj = "chat.completion"
    choice["finish_reason"] = result.finish_reason
    body = _envelope(spec, obj, [choice])
    body["usage"] = usage(len(spec.prompt_ids), result.completion_tokens, result.cached_tokens)
    body["dlmrt"] = result.stats()
    return body


def chunk_body(spec: RequestSpec, text: str | None, finish_reason: str | None = None) -> dict:
    """One streamed chunk: a text delta, or (text None) the final chunk carrying `finish_reason`."""
    if spec.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text or "", "logprobs": None}
        return _envelope(spec, "text_completion", [{**choice, "finish_reason": finish_reason}])
    delta = {} if text is None else {"content": text}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return _envelope(spec, "chat.completion.chunk", [choice])


def draft_chunk(spec: RequestSpec, draft: dict[str, Any]) -> dict[str, Any]:
    """The data of an `event: draft` SSE event: a chunk with an empty delta (so OpenAI clients that
    do not know the event read nothing new), the draft (`Draft.to_dict`) under `dlmrt.draft`."""
    body = chunk_body(spec, "" if spec.kind == "completion" else None)
    body["dlmrt"] = {"draft": draft}
    return body


def chat_role_chunk(spec: RequestSpec) -> dict[str, Any]:
    """The first chat chunk: the assistant role and empty content."""
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
    return _envelope(spec, "chat.completion.chunk", [{**choice, "finish_reason": None}])


def usage_chunk(spec: RequestSpec, result: Any) -> dict[str, Any]:
    obj = "text_completion" if spec.kind == "completion" else "chat.completion.chunk"
    body = _envelope(spec, obj, [])
    body["usage"] = usage(len(spec.prompt_ids), result.completion_tokens, result.cached_tokens)
    body["dlmrt"] = result.stats()
    return body


def _envelope(spec: RequestSpec, obj: str, choices: list) -> dict[str, Any]:
    return {
        "id": spec.request_id,
        "object": obj,
        "created": spec.created,
        "model": spec.model,
        "choices": choices,
    }
