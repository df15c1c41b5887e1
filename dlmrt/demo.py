"""The embedded default model: a 4.85M-parameter QwenDLM-format model trained on arithmetic.

`dlmrt generate` and `LLM()` without a model use it. It ships inside the package
(`dlmrt/assets/demo/`, bf16 weights, ~9.7 MB) and answers the short arithmetic word problems of
`dlmrt.tasks.arithmetic` step by step ("23 + 15 = 38. 38 - 9 = 29. The answer is 29."); it
knows nothing else. Its model card (`dlmrt/assets/demo/README.md`) says how it was trained (the
command reproduces it), on what, and how accurately and fast it decodes.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dlmrt.errors import CheckpointError

DEMO_DIR = Path(__file__).parent / "assets" / "demo"
DEMO_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def demo_model_path() -> Path:
    """Return the embedded demo model's directory; a clear error if the install lacks its files."""
    missing = [name for name in DEMO_FILES if not (DEMO_DIR / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{DEMO_DIR}: the embedded demo model is incomplete (missing {', '.join(missing)}); "
            "reinstall dlmrt or pass a model directory"
        )
    return DEMO_DIR


DEMO_PROMPT = (
    "Sam has 23 apples. He buys 15 more, then gives away 9. How many apples does Sam have?"
)


def log_demo_speed(llm) -> None:
    """The demo model on a GPU: one warm-up request (captures its graphs), then one timed and
    logged, so a user sees the engine's speed on the default model."""
    for _ in range(2):
        out = llm.generate(DEMO_PROMPT, max_new_tokens=64)
    logging.getLogger("dlmrt").info(
        "demo model in %s: %.0f tokens/s, %.3f ms per round (%d tokens, a warm-up request)",
        out.mode,
        out.request_tps,
        out.ms_per_round,
        len(out.token_ids),
    )
