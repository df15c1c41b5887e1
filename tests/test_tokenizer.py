"""Tokenizer: tokenizer.json encode/decode, the chat template, mask and stop ids from the checkpoint."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import EOS_ID, MASK_ID, VOCAB, write_checkpoint

from dlmrt import LLM
from dlmrt.errors import CheckpointError
from dlmrt.tokenizer import Tokenizer

IM_START, IM_END = 257, 258
CHATML_HI = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
USER_HI = [{"role": "user", "content": "hi"}]


def edit_json(path: Path, **changes: Any) -> None:
    """Update a JSON file's top-level keys; a value of None deletes the key."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "x")


# ---------------------------------------------------------------- encode / decode


@pytest.mark.parametrize("text", ["Hello, world! 123", "héllo wörld — 世界 🙂\n\ttab"])
def test_round_trip(ckpt: Path, text: str) -> None:
    """decode(encode(text)) == text for ASCII and non-ASCII (multi-byte) text."""
    tok = Tokenizer(ckpt)
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert len(ids) == len(text.encode("utf-8"))  # byte-level, no merges: one id per byte
    assert tok.decode(ids) == text


def test_special_tokens_encode_to_single_id(ckpt: Path) -> None:
    """Special tokens in text map to their single id; decode drops them unless asked to keep them."""
    tok = Tokenizer(ckpt)
    assert tok.encode("<|im_end|>") == [IM_END]
    ids = tok.encode("a<|im_end|>b")
    assert ids == [*tok.encode("a"), IM_END, *tok.encode("b")]
    assert tok.decode(ids) == "ab"
    assert tok.decode(ids, skip_special_tokens=False) == "a<|im_end|>b"


def test_vocab_size(ckpt: Path) -> None:
    """vocab_size counts the 256 bytes and the 4 added special tokens."""
    assert Tokenizer(ckpt).vocab_size == VOCAB


def test_missing_tokenizer_json(ckpt: Path) -> None:
    """A checkpoint without tokenizer.json raises CheckpointError naming the file."""
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=re.escape(str(ckpt / "tokenizer.json"))):
        Tokenizer(ckpt)


def test_corrupt_tokenizer_json(ckpt: Path) -> None:
    """An unparsable tokenizer.json raises CheckpointError naming the file."""
    (ckpt / "tokenizer.json").write_text("{not a tokenizer")
    pattern = re.escape(str(ckpt / "tokenizer.json")) + ".*unreadable"
    with pytest.raises(CheckpointError, match=pattern):
        Tokenizer(ckpt)


# ---------------------------------------------------------------- chat template


def test_chat_template_chatml(ckpt: Path) -> None:
    """One user message renders to the exact ChatML prompt with the assistant header."""
    assert Tokenizer(ckpt).apply_chat_template(USER_HI) == CHATML_HI


def test_chat_template_without_generation_prompt(ckpt: Path) -> None:
    """add_generation_prompt=False omits the assistant header."""
    rendered = Tokenizer(ckpt).apply_chat_template(USER_HI, add_generation_prompt=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n"


def test_jinja_file_takes_precedence(ckpt: Path) -> None:
    """chat_template.jinja is used over tokenizer_config.json's chat_template."""
    (ckpt / "chat_template.jinja").write_text("J:{{ messages[0]['content'] }}")
    assert Tokenizer(ckpt).apply_chat_template(USER_HI) == "J:hi"


def test_template_list_form_picks_default(ckpt: Path) -> None:
    """A list of named templates in tokenizer_config.json uses the one named 'default'."""
    templates = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    edit_json(ckpt / "tokenizer_config.json", chat_template=templates)
    assert Tokenizer(ckpt).apply_chat_template(USER_HI) == "D"


def test_no_template_raises(ckpt: Path) -> None:
    """A checkpoint without any chat template raises ValueError mentioning 'chat'."""
    edit_json(ckpt / "tokenizer_config.json", chat_template=None)
    tok = Tokenizer(ckpt)
    assert tok.chat_template is None
    with pytest.raises(ValueError, match="chat"):
        tok.apply_chat_template(USER_HI)


def test_template_raise_exception(ckpt: Path) -> None:
    """A template's raise_exception(...) surfaces as ValueError carrying its message."""
    (ckpt / "chat_template.jinja").write_text("{{ raise_exception('only user turns') }}")
    with pytest.raises(ValueError, match="chat.*only user turns"):
        Tokenizer(ckpt).apply_chat_template(USER_HI)


@pytest.mark.parametrize(
    "template, error",
    [("{{ 'x' * 10**20 }}", "OverflowError"), ("{{ 1 // 0 }}", "ZeroDivisionError")],
)
def test_a_template_failing_at_render_is_a_named_error(ckpt: Path, template: str, error: str):
    (ckpt / "chat_template.jinja").write_text(template)
    with pytest.raises(ValueError, match=f"chat: the chat template failed to render .{error}"):
        Tokenizer(ckpt).apply_chat_template(USER_HI)


@pytest.mark.parametrize(
    "template, error",
    [
        ("{% for m in messages %}{{ m['content'] }}", "line 1: Unexpected end of template"),
        ("{{ messages[0]['content'] | no_such_filter }}", "No filter named 'no_such_filter'"),
        ("hi\n{{ messages[0]['content'] }\n", "line 2:"),
    ],
    ids=["unclosed-block", "unknown-filter", "unclosed-expression"],
)
@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_template_that_does_not_compile_fails_at_load(
    ckpt: Path, template: str, error: str, where: str
) -> None:
    """A chat template with a jinja2 syntax error is a CheckpointError at load naming its file
    (not a failure at the first chat request)."""
    if where == "chat_template.jinja":
        (ckpt / where).write_text(template)
    else:
        edit_json(ckpt / where, chat_template=[{"name": "default", "template": template}])
    message = re.escape(f"{ckpt / where}: the chat template does not compile (") + ".*"
    with pytest.raises(CheckpointError, match=message + re.escape(error)):
        Tokenizer(ckpt)
    with pytest.raises(CheckpointError, match=re.escape(str(ckpt / where))):
        LLM(ckpt, device="cpu")


def test_template_that_is_not_a_string_fails_at_load(ckpt: Path) -> None:
    edit_json(ckpt / "tokenizer_config.json", chat_template=5)
    with pytest.raises(CheckpointError, match="tokenizer_config.json: 'chat_template' must be"):
        Tokenizer(ckpt)


# ---------------------------------------------------------------- mask token id


def test_mask_id_from_config_json(ckpt: Path) -> None:
    """config.json mask_token_id wins over the tokenizer's mask token."""
    edit_json(ckpt / "config.json", mask_token_id=42)
    edit_json(ckpt / "tokenizer_config.json", mask_token="<|im_start|>")
    assert Tokenizer(ckpt).mask_token_id == 42


def test_mask_id_from_explicit_config(ckpt: Path) -> None:
    """A config dict passed to Tokenizer is used instead of config.json."""
    assert Tokenizer(ckpt, config={"mask_token_id": 7}).mask_token_id == 7


@pytest.mark.parametrize("mask_token", ["<|im_start|>", {"content": "<|im_start|>"}])
def test_mask_id_from_tokenizer_config(ckpt: Path, mask_token: Any) -> None:
    """Without config.json mask_token_id, tokenizer_config's mask_token (str or AddedToken) is used."""
    edit_json(ckpt / "config.json", mask_token_id=None)
    edit_json(ckpt / "tokenizer_config.json", mask_token=mask_token)
    assert Tokenizer(ckpt).mask_token_id == IM_START


def test_mask_id_from_added_token(ckpt: Path) -> None:
    """With neither field, the '<|MASK|>' added token gives the mask id."""
    edit_json(ckpt / "config.json", mask_token_id=None)
    assert Tokenizer(ckpt).mask_token_id == MASK_ID


# ---------------------------------------------------------------- stop ids


@pytest.mark.parametrize(
    ("eos", "expected"), [(IM_END, {IM_END}), ([EOS_ID, IM_END], {EOS_ID, IM_END})]
)
def test_stop_ids_from_generation_config(ckpt: Path, eos: Any, expected: set[int]) -> None:
    """generation_config.json eos_token_id (int or list) gives the stop ids, over config.json's."""
    edit_json(ckpt / "config.json", eos_token_id=5)
    edit_json(ckpt / "generation_config.json", eos_token_id=eos)
    assert Tokenizer(ckpt).stop_ids == expected


def test_stop_ids_from_config_json(ckpt: Path) -> None:
    """Without generation_config.json, config.json eos_token_id gives the stop ids."""
    (ckpt / "generation_config.json").unlink()
    edit_json(ckpt / "config.json", eos_token_id=[EOS_ID, 3])
    assert Tokenizer(ckpt).stop_ids == {EOS_ID, 3}


def test_stop_ids_from_eos_token(ckpt: Path) -> None:
    """With no eos_token_id anywhere, tokenizer_config's eos_token text gives the stop id."""
    (ckpt / "generation_config.json").unlink()
    edit_json(ckpt / "config.json", eos_token_id=None)
    assert Tokenizer(ckpt).stop_ids == {IM_END}


# ---------------------------------------------------------------- end to end


def test_llm_chat_prompt_tokens(ckpt: Path) -> None:
    """LLM.generate(chat=True) feeds exactly the encoded rendered template as the prompt."""
    llm = LLM(ckpt)
    out = llm.generate("hi", chat=True, max_new_tokens=8)
    tok = Tokenizer(ckpt)
    rendered = tok.apply_chat_template(USER_HI)
    assert rendered == CHATML_HI
    # 3 special tokens + the 18 bytes of "user\nhi", "\n" and "assistant\n"
    assert out.prompt_tokens == len(tok.encode(rendered)) == 21
    assert 0 < len(out.token_ids) <= 8
    assert all(0 <= t < VOCAB for t in out.token_ids)
