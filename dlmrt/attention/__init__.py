"""Attention over the KV arena with block-diffusion visibility; `sdpa` is the reference backend."""

from dlmrt.attention.context import AttnContext
from dlmrt.attention.sdpa import block_attention

__all__ = ["AttnContext", "block_attention"]
