"""dlmrt: a single-request inference engine for block-diffusion language models (ORL).

Exports are resolved lazily so `import dlmrt` stays cheap (no torch import until used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "DecodeParams", "Draft", "GenerationOutput", "__version__"]

if TYPE_CHECKING:
    from dlmrt.drafts import Draft
    from dlmrt.llm import LLM
    from dlmrt.outputs import GenerationOutput
    from dlmrt.params import DecodeParams

_EXPORTS = {
    "LLM": "dlmrt.llm",
    "DecodeParams": "dlmrt.params",
    "Draft": "dlmrt.drafts",
    "GenerationOutput": "dlmrt.outputs",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dlmrt' has no attribute {name!r}")
