"""read_json: a checkpoint's JSON object files (config.json, generation_config.json, ...).

A leaf module, so the checkpoint loader, the tokenizer and the quantization config reader share it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlmrt.errors import CheckpointError


def read_json(path: Path, required: bool = True) -> dict[str, Any] | None:
    """Parse a JSON object file; a missing optional file gives None, anything unreadable raises."""
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path}: file not found")
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable JSON ({e})") from e
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
