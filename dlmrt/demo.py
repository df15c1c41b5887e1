"""The embedded default model: a 4.85M-parameter QwenDLM-format model trained on arithmetic.

`dlmrt generate` and `LLM()` without a model use it. It ships inside the package
(`dlmrt/assets/demo/`, bf16 weights, ~9.7 MB) and answers the short arithmetic word problems of
`dlmrt.train.tasks.arithmetic` step by step ("23 + 15 = 38. 38 - 9 = 29. The answer is 29."); it
knows nothing else. Its model card (`dlmrt/assets/demo/README.md`) says how it was trained (the
command reproduces it), on what, and how accurately and fast it decodes.
"""

from __future__ import annotations

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
