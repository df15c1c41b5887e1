"""Decoding styles: each owns its requests end to end (`docs/decoding.md`).

A style is built once per `LLM` from the one loaded checkpoint (`from_checkpoint`: its engine and
its decoder defaults) and then, per request, checks it (`check`), says how many positions it needs
(`rows_needed`, also the server's context check) and runs it (`generate`). `LLM` holds one style
and never branches on which.
  block            QwenDLM and LLaDA2 (`block.py`): rounds over blocks of B rows, a rule per request
  encoder_decoder  DiffusionGemma (`encoder_decoder.py`): denoising steps over a canvas
A style's request checks are in `checks.py`; the block style's defaults for the knobs a request
leaves unset (the checkpoint's, else dlmrt's) in `decoder_defaults.py`.
"""

from __future__ import annotations

from dlmrt.rules import BLOCK
from dlmrt.styles.base import Hooks, Setup, Style
from dlmrt.styles.block import BlockStyle
from dlmrt.styles.encoder_decoder import EncoderDecoderStyle

__all__ = ["BlockStyle", "EncoderDecoderStyle", "Hooks", "Setup", "Style", "style_for"]


def style_for(name: str) -> type[Style]:
    """The style class of a family's `style` name."""
    return BlockStyle if name == BLOCK else EncoderDecoderStyle
