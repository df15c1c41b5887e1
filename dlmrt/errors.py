"""Exceptions raised for bad checkpoints and bad requests (each message names the file or field)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory cannot be loaded: the message names the file and the tensor or field."""
