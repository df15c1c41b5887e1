"""DecodeParams: the per-request knobs, validated with errors that name the field.

Its fields are those of every request (written out below) and then each rule's knobs, generated
from their declarations in `dlmrt/rules.py` (default, help, bounds): see docs/decoding.md for why
the class is built with `dataclasses.make_dataclass` and how type checkers see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import TYPE_CHECKING, Any

from dlmrt import structured
from dlmrt.knobs import Knob, check_float, check_int
from dlmrt.rules import ENCODER_DECODER, KNOBS, RULE_NAMES, RULE_OF_KNOB, knob_help, style_knobs

# The block rules' knobs when neither the request nor the checkpoint sets them
# (dlmrt/styles/decoder_defaults.py says who decides what); declared in dlmrt/rules.py.
THRESHOLD: float = KNOBS["threshold"].fallback
ENTROPY_BUDGET: float = KNOBS["entropy_budget"].fallback
# DecodeParams fields that override a DiffusionGemma checkpoint's canvas-decoder settings.
CANVAS_FIELDS = tuple(k.name for k in style_knobs(ENCODER_DECODER, checkpoint=True))
# The smallest sampling temperature: softmax(logits / T) runs in float32, where logits / T overflows
# to inf (and the softmax to NaN) for T below ~1e-38 at ordinary logits; at 1e-6 a logit would
# have to exceed 1e32 to overflow. Sampling below it is greedy in all but name: use 0.
MIN_TEMPERATURE = 1e-6


def check_temperature(value: Any) -> None:
    """0 (greedy) or a finite T in [MIN_TEMPERATURE, 1e4]; ValueError naming `temperature`."""
    check_float("temperature", value, 0.0, 1e4)
    if 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature: must be 0 (greedy) or at least {MIN_TEMPERATURE:g} (softmax(logits / T) "
            f"overflows float32 below that), got {value!r}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestParams:
    """The fields of every request, whatever its rule; `DecodeParams` adds the rules' knobs."""

    max_new_tokens: int = field(
        default=256,
        metadata={"help": "generated tokens at most (the output is cut to this length)"},
    )
    rule: str | None = field(
        default=None,
        metadata={
            "help": "acceptance rule; None: the checkpoint's default (ORL: entropy_budget)",
            "choices": RULE_NAMES,
        },
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
        },
    )
    ignore_eos: bool = field(
        default=False, metadata={"help": "keep generating past stop tokens (benchmarks)"}
    )
    response_format: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": 'structured output, as JSON: {"type": "json_schema", "json_schema": '
            '{"schema": ...}} | json_object | regex | choices (docs/structured-output.md)'
        },
    )

    def __post_init__(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens, 1)
        if self.rule is not None and self.rule not in RULE_NAMES:
            raise ValueError(
                f"rule: unknown rule {self.rule!r} (choose from {', '.join(RULE_NAMES)})"
            )
        check_temperature(self.temperature)
        if self.seed is not None:
            check_int("seed", self.seed, 0, 2**63 - 1)
        if self.block_length is not None:
            check_int("block_length", self.block_length, 1)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: expected a bool, got {self.ignore_eos!r}")
        fmt = structured.parse(self.response_format)  # a JSON string (the CLI flag) is parsed
        object.__setattr__(self, "response_format", None if fmt is None else _as_dict(fmt))
        for knob in KNOBS.values():
            value = getattr(self, knob.name)
            knob.check(value)
            owner = RULE_OF_KNOB[knob.name].name
            if knob.selects_rule and value is not None and self.rule not in (None, owner):
                raise ValueError(f"{knob.name}: applies to rule {owner!r} only, not {self.rule!r}")

    def canvas_overrides(self) -> dict[str, Any]:
        """The canvas-decoder fields (None where the checkpoint's setting applies)."""
        return {name: getattr(self, name) for name in CANVAS_FIELDS}

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> DecodeParams:  # called on DecodeParams
        """Like the constructor, but an unknown keyword raises TypeError naming it and listing the valid ones."""
        valid = [f.name for f in fields(cls)]
        for key in kwargs:
            if key not in valid:
                raise TypeError(f"unknown decoding parameter {key!r} (valid: {', '.join(valid)})")
        return cls(**kwargs)


def _as_dict(fmt: structured.ResponseFormat) -> dict[str, Any]:
    """A checked format back in its request form (DecodeParams stays plain data: it is broadcast
    under tensor parallelism and compared in tests)."""
    if fmt.kind == "json_object":
        return {"type": "json_object"}
    if fmt.kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"schema": fmt.value}}
    return {"type": fmt.kind, fmt.kind: list(fmt.value) if fmt.kind == "choices" else fmt.value}


def _knob_field(knob: Knob) -> tuple[str, str, Any]:
    """The DecodeParams field of a declared knob: its flag's type, default, help and choices."""
    metadata = {"help": knob_help(knob), "choices": knob.choices or None}
    return knob.name, knob.annotation, field(default=knob.default, metadata=metadata)


if TYPE_CHECKING:
    # What a type checker sees: the request fields typed, the generated knobs as Any.

    class DecodeParams(RequestParams):
        def __init__(self, **kwargs: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...  # a rule's knob (dlmrt/rules.py)

else:
    DecodeParams = make_dataclass(
        "DecodeParams",
        [_knob_field(knob) for knob in KNOBS.values()],
        bases=(RequestParams,),
        frozen=True,
        slots=True,
        kw_only=True,
    )
    DecodeParams.__module__ = (
        __name__  # pickling finds it here (make_dataclass's own `module`: 3.12+)
    )
    DecodeParams.__doc__ = (
        "Per-request decoding parameters (`LLM.generate(**kwargs)` and `dlmrt generate` flags): "
        "`RequestParams`' fields, then every rule's knobs as declared in dlmrt/rules.py."
    )
