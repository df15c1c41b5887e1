"""OpenAI request schemas and their validation into a `RequestSpec` (responses: responses.py).

Bad input raises `APIError` (an HTTP status plus an OpenAI-style error body); nothing here runs the
engine. Extra body fields `rule`, `block_length`, `ignore_eos` and every rule's knobs (`threshold`,
`entropy_budget`, ..., DiffusionGemma's `entropy_bound`, ...: one optional field per knob declared
in `dlmrt/rules.py`) map to the `DecodeParams` fields of the same name, which check them. The
`dlmrt` object holds dlmrt's own options: `{"drafts": true}` (with `stream: true`) adds
`event: draft` SSE events, one per round (`docs/drafts.md`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

from dlmrt.blocks import layout, room
from dlmrt.params import DecodeParams
from dlmrt.rules import KNOBS
from dlmrt.server.errors import APIError, check_prompt_chars, error_body  # noqa: F401
from dlmrt.server.messages import include_usage, message_text

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4
# The body fields passed to DecodeParams when set (max_new_tokens comes from max_tokens).
DECODE_FIELDS = tuple(f.name for f in fields(DecodeParams) if f.name != "max_new_tokens")
# Strict: "0.5" is not a number and 1.0 is not an integer. Unknown fields are rejected.
STRICT = ConfigDict(strict=True, extra="forbid")
# OpenAI fields the engine cannot honour: accepted only at the value that changes nothing.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "top_p": (None, 1, 1.0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),  # without tools, "auto" calls none
}


class DlmrtOptions(BaseModel):
    """The request's `dlmrt` object: options of dlmrt's own (not decoding knobs)."""

    model_config = STRICT

    drafts: bool = False  # stream: true only; `event: draft` SSE events, one per round


# The rules' knobs as body fields, unset by default: their types here, their bounds in DecodeParams.
_RuleKnobs = create_model(
    "_RuleKnobs", __config__=STRICT, **{k.name: (k.type | None, None) for k in KNOBS.values()}
)


class _Request(_RuleKnobs):
    model_config = STRICT

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    n: int | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # dlmrt extensions (DecodeParams fields; the rules' knobs come from _RuleKnobs)
    rule: str | None = None
    block_length: int | None = None
    ignore_eos: bool | None = None
    response_format: dict[str, Any] | None = None  # docs/structured-output.md
    dlmrt: DlmrtOptions | None = None


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    best_of: int | None = None
    echo: bool | None = None
    logprobs: int | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # name, tool_call_id, ...: ignored

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


@dataclass
class RequestSpec:
    """A validated request: what the worker runs and how the answer is shaped."""

    kind: Literal["completion", "chat"]
    model: str
    prompt_ids: list[int]
    params: DecodeParams
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    drafts: bool = False  # `event: draft` SSE events (stream only)
    request_id: str = ""
    created: int = 0


@dataclass(frozen=True)
class ModelInfo:
    """What validation needs to know about the served model."""

    name: str
    tokenizer: Any  # dlmrt.tokenizer.Tokenizer
    vocab_size: int
    block_size: int | None  # the block style's block length (None: encoder-decoder); no style only
    max_positions: int
    max_prompt_chars: int | None = None  # longer prompts cannot fit: refused before tokenizing
    style: Any = None  # the LLM's decoding style (`dlmrt/styles/`): its rows_needed / room

    def rows_needed(self, prompt_len: int, max_tokens: int, block_length: int | None) -> int:
        """Positions the request occupies, as the style lays it out (blocks or canvases)."""
        if self.style is not None:
            return self.style.rows_needed(prompt_len, max_tokens, block_length)
        return layout(prompt_len, max_tokens, block_length or self.block_size).max_len

    def room(self, prompt_len: int, block_length: int | None) -> int:
        """The most new tokens that fit the context after the prompt."""
        if self.style is not None:
            return self.style.room(prompt_len, block_length)
        return room(self.max_positions, prompt_len, block_length or self.block_size)


def completion_spec(req: CompletionRequest, info: ModelInfo) -> RequestSpec:
    check_model(req.model, info)
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise APIError(400, "prompt: one prompt per request (batches are not served)", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        check_prompt_chars(len(prompt), info.max_prompt_chars)
        ids = info.tokenizer.encode(_unicode(prompt, "prompt"))
    else:
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < info.vocab_size]
        if bad:
            raise APIError(
                400, f"prompt: token id {bad[0]} is outside [0, {info.vocab_size})", "prompt"
            )
    default = COMPLETIONS_DEFAULT_MAX_TOKENS
    return _spec("completion", req, ids, req.max_tokens, default, info)


def chat_spec(req: ChatCompletionRequest, info: ModelInfo) -> RequestSpec:
    check_model(req.model, info)
    if not req.messages:
        raise APIError(400, "messages: must contain at least one message", "messages")
    messages = [
        {
            "role": m.role,
            "content": message_text(m.role, m.content, "content" in m.model_fields_set, i),
        }
        for i, m in enumerate(req.messages)
    ]
    check_prompt_chars(sum(len(m["content"]) for m in messages), info.max_prompt_chars)
    for i, m in enumerate(messages):
        _unicode(m["content"], f"messages[{i}].content")
    try:
        text = info.tokenizer.apply_chat_template(messages)
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None
    ids = info.tokenizer.encode(text)
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return _spec("chat", req, ids, limit, DecodeParams().max_new_tokens, info)


def _unicode(text: str, param: str) -> str:
    """`text` if it is valid Unicode; JSON's \\ud800 escapes can give a lone surrogate, which no
    tokenizer can encode: a 400 naming the field, not a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(
            400,
            f"{param}: not valid Unicode (a lone surrogate {text[e.start]!r} at "
            f"character {e.start})",
            param,
        ) from None
    return text


def check_model(model: str | None, info: ModelInfo) -> None:
    if model is not None and model != info.name:
        raise APIError(
            404,
            f"The model {model!r} does not exist (this server serves {info.name!r})",
            "model",
            "model_not_found",
        )


def _spec(
    kind: str, req: _Request, ids: list[int], max_tokens: int | None, default: int, info: ModelInfo
) -> RequestSpec:
    _check_neutral(req)
    if not ids:
        raise APIError(400, "prompt: must not be empty", "prompt")
    if max_tokens is None:  # the default is capped to the room left (as vLLM), not refused
        max_tokens = max(1, min(default, info.room(len(ids), req.block_length)))
    if max_tokens < 1:
        raise APIError(400, f"max_tokens: must be >= 1, got {max_tokens}", "max_tokens")
    params = _decode_params(req, max_tokens)
    drafts = req.dlmrt is not None and req.dlmrt.drafts
    total = info.rows_needed(len(ids), max_tokens, params.block_length)
    if total > info.max_positions:
        raise APIError(
            400,
            f"prompt: {len(ids)} prompt tokens + max_tokens {max_tokens} (rounded up to {total} "
            f"positions: whole blocks or canvases) exceed the model's context of "
            f"{info.max_positions} tokens",
            "prompt",
            "context_length_exceeded",
        )
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP_STRINGS or any(not s for s in stop):
        raise APIError(400, f"stop: at most {MAX_STOP_STRINGS} non-empty strings", "stop")
    for text in stop:
        _unicode(text, "stop")
    _check_format(params, info, drafts)  # last: compiling a grammar is the costliest check
    if drafts and not req.stream:
        raise APIError(400, "dlmrt.drafts: needs stream: true (drafts are SSE events)", "dlmrt")
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    return RequestSpec(
        kind=kind,  # type: ignore[arg-type]
        model=info.name,
        prompt_ids=ids,
        params=params,
        stop=stop,
        stream=req.stream,
        include_usage=include_usage(req.stream_options, req.stream),
        drafts=drafts,
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        created=int(time.time()),
    )


def _check_neutral(req: _Request) -> None:
    for name, allowed in NEUTRAL_VALUES.items():
        value = getattr(req, name, None)
        if value is not None and value not in allowed:
            raise APIError(
                400, f"{name}: {value!r} is not supported by dlmrt (leave it unset)", name
            )


def _check_format(params: DecodeParams, info: ModelInfo, drafts: bool) -> None:
    """A bad schema or budget is a 400: validation only, the `Constraint` built here is thrown
    away (the grammar stays cached; the request builds its own Constraint when it runs)."""
    if params.response_format is None:
        return
    try:
        if drafts:
            raise ValueError("response_format: not supported with dlmrt.drafts")
        info.style.constraint(params)
    except ValueError as e:
        raise APIError(400, str(e), "response_format") from None


def _decode_params(req: _Request, max_tokens: int) -> DecodeParams:
    kwargs: dict[str, Any] = {"max_new_tokens": max_tokens}
    for name in DECODE_FIELDS:
        if getattr(req, name) is not None:
            kwargs[name] = getattr(req, name)
    try:
        return DecodeParams.from_kwargs(**kwargs)
    except (ValueError, TypeError) as e:
        param = str(e).split(":", 1)[0] if ":" in str(e) else None
        raise APIError(400, str(e), param) from None
