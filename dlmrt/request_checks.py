"""Per-request checks `LLM.generate` runs whatever the decoding style (the prompt, the callbacks):
each error names the parameter that is wrong. The style-specific ones are the style's
(`dlmrt/styles/checks.py`)."""

from __future__ import annotations

import warnings


def check_token_ids(prompt: object, vocab: int) -> list[int]:
    if not isinstance(prompt, list | tuple) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        raise ValueError("prompt: expected a string or a list of token ids (ints)")
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary [0, {vocab})")
    return list(prompt)


def prompt_ids(tokenizer, prompt: str | list[int], chat: bool, vocab: int) -> list[int]:
    """A request's prompt as token ids: text encoded (through the chat template with `chat`), or
    ids checked. A named error when the tokenizer gives an id the model's table lacks (a
    tokenizer.json of another checkpoint): not an index error inside the embedding."""
    if not isinstance(prompt, str):
        if chat:
            raise ValueError("chat: needs a text prompt, got token ids")
        return check_token_ids(prompt, vocab)
    if chat:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    ids = tokenizer.encode(prompt)
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(
            f"prompt: the tokenizer gave token id {bad} ({tokenizer.decode([bad])!r}) but the "
            f"model's vocabulary has {vocab} ids: tokenizer.json does not belong to this checkpoint"
        )
    return ids


def check_callbacks(
    chat: object,
    recorder: object,
    on_progress: object,
    should_stop: object,
    on_round: object = None,
    on_tokens: object = None,
) -> None:
    """`chat` a bool, the callbacks callables (or None): named errors, not failures mid-request."""
    if not isinstance(chat, bool):
        raise TypeError(f"chat: expected True or False, got {chat!r}")
    named = ("recorder", recorder), ("on_progress", on_progress), ("should_stop", should_stop)
    for name, fn in (*named, ("on_round", on_round), ("on_tokens", on_tokens)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name}: expected a callable or None, got {type(fn).__name__}")


def renamed_on_block(kwargs: dict, on_progress: object) -> object:
    """`on_progress`, or the callback passed under its former name `on_block` (popped from
    `kwargs`; deprecated: it is also called after each canvas, not only after blocks)."""
    if "on_block" not in kwargs:
        return on_progress
    old = kwargs.pop("on_block")
    if on_progress is not None:
        raise TypeError("generate: pass on_progress, not both on_progress and on_block")
    warnings.warn(
        "generate(on_block=...) is deprecated: pass on_progress=... (called after "
        "each block or canvas)",
        DeprecationWarning,
        stacklevel=3,
    )
    return old


def check_not_empty(ids: list[int], prompt: object) -> None:
    """An empty prompt is an error, as in the server (the engines accept one; `LLM` does not)."""
    if not ids:
        what = "an empty string" if prompt == "" else "no tokens"
        raise ValueError(f"prompt: is empty ({what}); give at least one token")
