"""Per-request checks `LLM.generate` runs before an engine sees a request: each error names the
parameter that is wrong. Style-specific ones follow the family's decoding style (`dlmrt/rules.py`)."""

from __future__ import annotations

import warnings

from dlmrt.blocks import layout
from dlmrt.params import DecodeParams
from dlmrt.rules import BLOCK, ENCODER_DECODER, RULE_OF_KNOB, RULES, style_knobs


def check_rule_style(params: DecodeParams, style: str, architecture: str) -> None:
    """Reject rules and knobs of the other decoding style, naming them (a knob counts as set when
    it differs from its default)."""
    rule = RULES.get(params.rule) if params.rule else None
    other = style_knobs(ENCODER_DECODER if style == BLOCK else BLOCK)
    set_ = [k for k in other if getattr(params, k.name) != k.default]
    if style == BLOCK:
        if (rule is not None and rule.style != BLOCK) or set_:
            what = ", ".join(k.name for k in set_) or "rule entropy_bound_canvas"
            raise ValueError(
                f"{what}: canvas-decoder settings apply to DiffusionGemma checkpoints only, "
                f"not {architecture}"
            )
        return
    for k in set_:
        if k.selects_rule:
            raise ValueError(
                f"{k.name}: applies to rule {RULE_OF_KNOB[k.name].name!r} only, not to canvas "
                "decoding"
            )
    if set_:
        raise ValueError(
            f"{', '.join(k.name for k in set_)}: block-rule settings do not apply to {architecture} "
            "(its decoder is entropy_bound_canvas: entropy_bound, confidence_threshold, ...)"
        )
    if rule is not None and rule.style != style:
        raise ValueError(
            f"rule: {params.rule!r} does not apply to {architecture} "
            "(its decoder is entropy_bound_canvas)"
        )


def check_block_length(
    prompt_len: int, params: DecodeParams, block: int, limit: int, trained: int | None = None
) -> None:
    """The request's blocks fit the context; and (`trained`: the checkpoint's block size) are no
    larger than the model was trained with: a wider block lets rows see positions they never saw
    in training, and the model decodes garbage. A smaller one is accepted (1 is left-to-right
    decoding): a finer block-causal mask than training's."""
    if trained is not None and block > trained:
        raise ValueError(
            f"block_length: {block} is larger than the checkpoint's block_size {trained} "
            "(its rows were trained to see at most that block; use <= it)"
        )
    total = layout(prompt_len, params.max_new_tokens, block).max_len
    if total > limit:
        raise ValueError(
            f"prompt: {prompt_len} prompt tokens + max_new_tokens {params.max_new_tokens} "
            f"(rounded up to {total}, whole blocks of {block}) exceed the model's "
            f"max_position_embeddings {limit}"
        )


def check_encoder_decoder_request(ids: list[int], params: DecodeParams, length: int, cfg) -> None:
    if params.temperature or params.block_length not in (None, length):
        raise ValueError(
            "temperature, block_length: fixed by DiffusionGemma's decoder (use t_min/t_max; "
            f"the canvas length is {length})"
        )
    images = set(ids) & set(cfg.image_token_ids)
    if images:
        raise ValueError(
            f"prompt: holds image token id {min(images)}; dlmrt runs the text tower only "
            "(image inputs are not supported)"
        )
    total = len(ids) + -(-params.max_new_tokens // length) * length
    if total > cfg.max_position_embeddings:
        raise ValueError(
            f"prompt: {len(ids)} prompt tokens + max_new_tokens {params.max_new_tokens} "
            f"(rounded up to {total}, whole canvases of {length}) exceed the model's "
            f"max_position_embeddings {cfg.max_position_embeddings}"
        )


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
) -> None:
    """`chat` a bool, the callbacks callables (or None): named errors, not failures mid-request."""
    if not isinstance(chat, bool):
        raise TypeError(f"chat: expected True or False, got {chat!r}")
    named = ("recorder", recorder), ("on_progress", on_progress), ("should_stop", should_stop)
    for name, fn in (*named, ("on_round", on_round)):
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
