"""Structured output: a request's `response_format` (JSON schema, JSON object, regex, choices)
enforced while a block-diffusion model decodes (`docs/structured-output.md`).

    formats.py   ResponseFormat: the request's `response_format`, checked (no engine needed)
    grammar.py   Grammars / Constraint on llguidance (the optional extra `dlmrt[structured]`)
    closing.py   the closing search that reserves the tokens a document needs to end in budget

The block engine drives a `Constraint` round by round (`dlmrt/engine/block/structured.py`), the
canvas engine step by step (`dlmrt/engine/encoder_decoder/structured.py`).
"""

from typing import Any

from dlmrt.structured.formats import ResponseFormat, from_cli, parse

# each rank holds its vocabulary shard of the logits (`dlmrt/parallel/vocab.py`); the grammar
# masks whole rows on one host
STRUCTURED_TP = (
    "response_format: structured output is not supported under tensor parallelism (each rank "
    "holds only its shard of the vocabulary; run the request on one GPU)"
)


def constraint_for(
    response_format: Any,
    tokenizer: Any,
    vocab_size: int,
    stop_ids,
    budget: int,
    tensor_parallel: bool = False,
):
    """A request's grammar state (`grammar.Constraint`; None: unconstrained). ValueErrors name
    what is wrong: the format, a grammar that cannot compile, a budget no document fits, tensor
    parallelism, or the missing extra. Unconstrained requests never import the engine."""
    fmt = parse(response_format)
    if fmt is None:
        return None
    if tensor_parallel:
        raise ValueError(STRUCTURED_TP)
    from dlmrt.structured.grammar import grammars_for  # needs the `structured` extra

    return grammars_for(tokenizer, vocab_size, set(stop_ids)).constraint(fmt, budget)


__all__ = ["ResponseFormat", "constraint_for", "from_cli", "parse"]
