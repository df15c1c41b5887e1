"""Structured output: a request's `response_format` (JSON schema, JSON object, regex, choices)
enforced while a block-diffusion model decodes (`docs/structured-output.md`).

    formats.py   ResponseFormat: the request's `response_format`, checked (no engine needed)
    grammar.py   Grammars / Constraint on llguidance (the optional extra `dlmrt[structured]`)
    closing.py   the closing search that reserves the tokens a document needs to end in budget

The block engine drives a `Constraint` round by round (`dlmrt/engine/block/structured.py`).
"""

from dlmrt.structured.formats import ResponseFormat, from_cli, parse

__all__ = ["ResponseFormat", "from_cli", "parse"]
