"""Chat messages and stream options are checked as OpenAI checks them: a missing or null `content`,
an unknown role, a non-text content part or a non-boolean `stream_options.include_usage` is a 400
naming the message index and field (validation only: no model runs)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pydantic")

from dlmrt.server.errors import APIError  # noqa: E402
from dlmrt.server.protocol import ChatCompletionRequest, ModelInfo, chat_spec  # noqa: E402


class _Tokenizer:
    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 200 for c in text]


INFO = ModelInfo("m", _Tokenizer(), vocab_size=260, block_size=8, max_positions=4096)


def _spec(body: dict[str, Any]):
    return chat_spec(ChatCompletionRequest.model_validate(body), INFO)


def _error(body: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as info:
        _spec(body)
    assert info.value.status == 400
    return info.value


def _msgs(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}, *messages]}


def test_message_without_content_is_400():
    err = _error(_msgs({"role": "assistant"}))
    assert err.message.startswith("messages[1].content: is required") and err.param == "messages"


def test_message_with_null_content_is_400():
    err = _error(_msgs({"role": "user", "content": None}))
    assert err.message == "messages[1].content: must be a string or a list of text parts, got null"


def test_unknown_role_is_400():
    err = _error(_msgs({"role": "bot", "content": "x"}))
    assert err.message.startswith("messages[1].role: 'bot' is not one of 'system'")


def test_non_text_part_names_the_part():
    parts = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]
    err = _error(_msgs({"role": "user", "content": parts}))
    assert err.message.startswith("messages[1].content[1]: only text parts")
    assert err.message.endswith("got type 'image_url'")
    err = _error(_msgs({"role": "user", "content": [{"type": "text"}]}))
    assert err.message == (
        "messages[1].content[0].text: a text part needs a string 'text', got None"
    )


def test_text_parts_and_known_roles_accepted():
    body = _msgs(
        {"role": "assistant", "content": ""},
        {
            "role": "system",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
    )
    spec = _spec(body)
    assert spec.prompt_ids == _Tokenizer().encode("<user>hi<assistant><system>ab")


@pytest.mark.parametrize("value", ["yes", 1, 0, [], {}])
def test_include_usage_must_be_bool(value):
    err = _error({**_msgs(), "stream": True, "stream_options": {"include_usage": value}})
    assert err.message.startswith("stream_options.include_usage: must be a boolean, got ")
    assert err.param == "stream_options"


@pytest.mark.parametrize(("stream", "value", "want"), [(True, True, True), (False, True, False)])
def test_include_usage_bool_accepted(stream, value, want):
    body = {**_msgs(), "stream": stream, "stream_options": {"include_usage": value}}
    assert _spec(body).include_usage is want
