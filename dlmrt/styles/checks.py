"""The checks a decoding style runs on a request before its engine sees it (`Style.check`): each
error names the parameter that is wrong."""

from __future__ import annotations

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
