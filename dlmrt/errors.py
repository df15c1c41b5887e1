"""Exceptions raised for bad checkpoints and bad requests (each message names the file or field)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory cannot be loaded: the message names the file and the tensor or field."""


class GenerationCancelled(Exception):
    """Raised by `LLM.generate` when its `should_stop` callback returned True (between rounds in the
    eager and round_graph modes, between blocks in block_graph). The engine is ready for the next
    request."""


class NonFiniteError(RuntimeError):
    """A round's logits were NaN or infinite (read with the block's one read-back: no extra sync).
    The message names the block and, where a scan of the model finds one, the non-finite weight
    (`dlmrt.engine.nonfinite.diagnose`). The engine is ready for the next request."""
