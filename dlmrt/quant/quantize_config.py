"""QuantizeConfig: the settings of `dlmrt quantize` (`quantize.py`), apart from the code that
runs it so that building the CLI's parser imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlmrt.tasks import TASKS as _TASK_MODULES  # stdlib only: cheap

QUANT_FORMATS, LAYOUTS, HESSIANS = (
    ("nvfp4", "fp8"),
    ("modelopt", "compressed-tensors"),
    ("block", "diag", "none"),
)
TASKS = tuple(_TASK_MODULES)
REPORT = "quantize_report.json"


def _f(default: Any, help: str, choices: tuple | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizeConfig:
    model: str | None = _f(None, "checkpoint directory to quantize (bf16 / fp32, HF layout)")
    out: str | None = _f(None, "output checkpoint directory")
    format: str = _f("nvfp4", "weight format", QUANT_FORMATS)
    layout: str = _f("modelopt", "checkpoint layout written", LAYOUTS)
    calibration: str | None = _f(
        None, "JSONL of calibration prompts ('prompt', 'question' or 'text' per line); nvfp4 only"
    )
    task: str | None = _f(None, "calibrate on a task's training prompts instead", TASKS)
    samples: int = _f(64, "calibration prompts used")
    max_new_tokens: int = _f(32, "tokens decoded per calibration prompt")
    hessian: str = _f(
        "block",
        "block-scale search under H = XᵀX: block = its 16 x 16 diagonal "
        "blocks, diag = its diagonal, none = amax / 6",
        HESSIANS,
    )
    device: str | None = _f(None, "calibration device (default: cuda if available)")

    def __post_init__(self) -> None:
        if not self.model or not self.out:
            raise ValueError("quantize: --model and --out are required")
        for name, allowed in (
            ("format", QUANT_FORMATS),
            ("layout", LAYOUTS),
            ("hessian", HESSIANS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}: expected one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"task: expected one of {', '.join(TASKS)}, got {self.task!r}")
        if self.calibration and self.task:
            raise ValueError("quantize: give --calibration or --task, not both")
        if self.format == "fp8" and (self.calibration or self.task):
            raise ValueError("quantize: fp8 takes no calibration (per-channel amax scales)")
        if self.samples < 1 or self.max_new_tokens < 1:
            raise ValueError("quantize: --samples and --max-new-tokens must be >= 1")
