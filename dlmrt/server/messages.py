"""Chat messages and stream options checked as OpenAI checks them: every message needs a known role
and a `content` (a string or a list of {"type": "text", "text": ...} parts); a bad one is a 400
naming its index and field (`messages[2].content`)."""

from __future__ import annotations

from typing import Any

from dlmrt.server.errors import APIError

ROLES = ("system", "developer", "user", "assistant", "tool")


def message_text(role: str, content: Any, has_content: bool, index: int) -> str:
    """The text of message `index`; 400 for an unknown role or a missing / null / non-text content."""
    where = f"messages[{index}]"
    if role not in ROLES:
        raise APIError(
            400, f"{where}.role: {role!r} is not one of {', '.join(map(repr, ROLES))}", "messages"
        )
    if not has_content:
        raise APIError(
            400, f"{where}.content: is required (a string or a list of text parts)", "messages"
        )
    if content is None:
        raise APIError(
            400, f"{where}.content: must be a string or a list of text parts, got null", "messages"
        )
    if isinstance(content, str):
        return content
    return "".join(_part_text(part, f"{where}.content[{i}]") for i, part in enumerate(content))


def _part_text(part: dict[str, Any], where: str) -> str:
    kind = part.get("type")
    if kind != "text":
        got = "no 'type'" if kind is None else f"type {kind!r}"
        raise APIError(
            400,
            f'{where}: only text parts ({{"type": "text", "text": ...}}) are supported, got {got}',
            "messages",
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise APIError(
            400, f"{where}.text: a text part needs a string 'text', got {text!r}", "messages"
        )
    return text


def include_usage(options: dict[str, Any] | None, stream: bool) -> bool:
    """`stream_options.include_usage`: a bool when given (400 otherwise); counts only when streaming."""
    value = (options or {}).get("include_usage")
    if value is not None and not isinstance(value, bool):
        raise APIError(
            400,
            f"stream_options.include_usage: must be a boolean, got {value!r}",
            "stream_options",
        )
    return bool(stream and value)
