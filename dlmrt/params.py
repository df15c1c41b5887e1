"""DecodeParams: the per-request knobs, validated with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from dlmrt.rules import RULE_NAMES

# The block rules' knobs when neither the request nor the checkpoint sets them
# (dlmrt/decoder_defaults.py says who decides what).
THRESHOLD = 0.9
ENTROPY_BUDGET = 0.8
EDITING_PRESETS = ("quality", "speed")  # thresholds: dlmrt.decoding.llada_editing.PRESETS
# DecodeParams fields that override a DiffusionGemma checkpoint's canvas-decoder settings.
CANVAS_FIELDS = (
    "max_denoising_steps",
    "entropy_bound",
    "t_min",
    "t_max",
    "stability_threshold",
    "confidence_threshold",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeParams:
    """Per-request decoding parameters (`LLM.generate(**kwargs)` and `dlmrt generate` flags)."""

    max_new_tokens: int = field(
        default=256,
        metadata={"help": "generated tokens at most (the output is cut to this length)"},
    )
    rule: str | None = field(
        default=None,
        metadata={"help": "acceptance rule; None: the checkpoint's default (ORL: entropy_budget)"},
    )
    threshold: float | None = field(
        default=None,
        metadata={
            "help": "`threshold` rule: accept rows with confidence > tau; None: the checkpoint's "
            f"default (generation_config.json 'dlmrt_decoder'), else {THRESHOLD}"
        },
    )
    entropy_budget: float | None = field(
        default=None,
        metadata={
            "help": "`entropy_budget` rule: gamma, in nats; None: the checkpoint's default, "
            f"else {ENTROPY_BUDGET}"
        },
    )
    denoising_steps: int | None = field(
        default=None,
        metadata={"help": "`fixed_steps` rule: rounds per block; None: the block length"},
    )
    editing: str | None = field(
        default=None,
        metadata={
            "help": "`llada_editing` preset: quality (tau_mask 0.7, tau_edit 0.5) | speed (0.5, "
            "0.0); implies that rule; None: quality when the rule is llada_editing"
        },
    )
    max_post_steps: int = field(
        default=16,
        metadata={"help": "`llada_editing`: editing rounds at most once a block has no masks"},
    )
    temperature: float = field(
        default=0.0, metadata={"help": "0: greedy; > 0: sample from softmax(logits / T)"}
    )
    seed: int | None = field(
        default=None, metadata={"help": "seed of the sampling generator (temperature > 0); None: 0"}
    )
    block_length: int | None = field(
        default=None,
        metadata={
            "help": "block size B, at most the checkpoint's (a wider block than the model "
            "was trained with is refused); None: the checkpoint's"
        },  # fmt: skip
    )
    ignore_eos: bool = field(
        default=False, metadata={"help": "keep generating past stop tokens (benchmarks)"}
    )
    # DiffusionGemma's `entropy_bound_canvas` decoder; None: the checkpoint's generation_config.
    max_denoising_steps: int | None = field(
        default=None, metadata={"help": "canvas decoder: denoising steps per canvas at most"}
    )
    entropy_bound: float | None = field(
        default=None, metadata={"help": "canvas decoder: entropy bound of the acceptance (nats)"}
    )
    t_min: float | None = field(
        default=None, metadata={"help": "canvas decoder: temperature at the last step"}
    )
    t_max: float | None = field(
        default=None, metadata={"help": "canvas decoder: temperature at the first step"}
    )
    stability_threshold: int | None = field(
        default=None, metadata={"help": "canvas decoder: steps the argmax canvas must be stable"}
    )
    confidence_threshold: float | None = field(
        default=None, metadata={"help": "canvas decoder: mean entropy below which it may stop"}
    )
    rng: str | None = field(
        default=None,
        metadata={
            "help": "canvas decoder noise: torch (transformers' draws) or counter (hashed from "
            "seed and step: graph-replayable); None: counter in a graph mode, else torch (torch "
            "in a graph mode runs that request on the eager reference path)"
        },
    )

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 1)
        if self.rule is not None and self.rule not in RULE_NAMES:
            raise ValueError(
                f"rule: unknown rule {self.rule!r} (choose from {', '.join(RULE_NAMES)})"
            )
        if self.editing is not None:
            if self.editing not in EDITING_PRESETS:
                raise ValueError(
                    f"editing: expected one of {', '.join(EDITING_PRESETS)}, got {self.editing!r}"
                )
            if self.rule not in (None, "llada_editing"):
                raise ValueError(
                    f"editing: applies to rule 'llada_editing' only, not {self.rule!r}"
                )
        _check_int("max_post_steps", self.max_post_steps, 0)
        if self.threshold is not None:
            _check_float("threshold", self.threshold, 0.0, 1.0)
        if self.entropy_budget is not None:
            _check_float("entropy_budget", self.entropy_budget, 0.0, 1e4)  # finite, nats
        _check_float("temperature", self.temperature, 0.0, 1e4)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**63 - 1)
        if self.denoising_steps is not None:
            _check_int("denoising_steps", self.denoising_steps, 1)
        if self.block_length is not None:
            _check_int("block_length", self.block_length, 1)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: expected a bool, got {self.ignore_eos!r}")
        for name in ("max_denoising_steps", "stability_threshold"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1 if name == "max_denoising_steps" else 0)
        for name in ("entropy_bound", "t_min", "t_max", "confidence_threshold"):
            if getattr(self, name) is not None:
                _check_float(name, getattr(self, name), 0.0, 1e4)
        for name in ("entropy_bound", "t_min", "t_max"):
            if getattr(self, name) == 0:
                raise ValueError(f"{name}: must be > 0, got 0")
        if self.rng not in (None, "torch", "counter"):
            raise ValueError(f"rng: expected 'torch' or 'counter', got {self.rng!r}")

    def canvas_overrides(self) -> dict[str, Any]:
        """The canvas-decoder fields (None where the checkpoint's setting applies)."""
        return {name: getattr(self, name) for name in CANVAS_FIELDS}

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> DecodeParams:
        """Like the constructor, but an unknown keyword raises TypeError naming it and listing the valid ones."""
        valid = [f.name for f in fields(cls)]
        for key in kwargs:
            if key not in valid:
                raise TypeError(f"unknown decoding parameter {key!r} (valid: {', '.join(valid)})")
        return cls(**kwargs)


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")


def _check_float(name: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    if not (low <= value <= high) or value != value:
        raise ValueError(f"{name}: must be in [{low}, {high}], got {value}")
