"""Knob: one setting of an acceptance rule, declared once beside its rule in `dlmrt/rules.py`.

A declaration is the only place a knob's name, type, default, bounds and help are written; the
rest is derived from it: the `DecodeParams` field (dlmrt/params.py) and so the `--kebab-case`
flag of `dlmrt generate` / `bench` / `serve` (dlmrt/flags.py), the HTTP extension field
(dlmrt/server/protocol.py), bench sweeps, the rule `make_rule` builds, and what a checkpoint's
generation_config.json may set. A leaf module without torch: the CLI's parser is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Why a help text ends this way: the knobs a checkpoint may set are None until resolved.
_CHECKPOINT_SAYS = {
    "block": "None: the checkpoint's default (generation_config.json 'dlmrt_decoder'), else",
    "encoder_decoder": "None: the checkpoint's generation_config, else",
}


@dataclass(frozen=True, slots=True)
class Knob:
    """A rule's knob. `default` is DecodeParams' (None: unset, decided later); `fallback` is the
    value the rule reads when neither the request nor the checkpoint sets it (the default when
    there is one; None: none fixed, `help` says who decides). `checkpoint`: the checkpoint's generation_config.json may set it (then the rule's
    style names the entry). `selects_rule`: setting it picks its rule when the request names
    none, and is refused with another rule (a preset of one rule means nothing to the others). Numbers are checked against [low, high] (ints: `high` None for no upper
    bound; floats give both, so the bound is finite; `above_low`: low itself is refused too), a
    string against `choices`."""

    name: str
    type: type  # int | float | str
    help: str
    default: Any = None
    fallback: Any = None
    checkpoint: bool = False
    selects_rule: bool = False
    low: float | None = None
    high: float | None = None
    above_low: bool = False
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.fallback is None and self.default is not None:  # the rule reads one value
            object.__setattr__(self, "fallback", self.default)

    @property
    def annotation(self) -> str:
        """The DecodeParams field's annotation, as a string like the hand-written fields'."""
        return self.type.__name__ + (" | None" if self.default is None else "")

    def describe(self, style: str) -> str:
        """The help text of the field, flag and HTTP field, with the checkpoint's part."""
        if not self.checkpoint:
            return self.help
        return f"{self.help}; {_CHECKPOINT_SAYS[style]} {self.fallback}"

    def check(self, value: Any) -> None:
        """ValueError naming the knob and the bound it breaks; None passes where it is the default."""
        if value is None and self.default is None:
            return
        if self.type is int:
            check_int(self.name, value, self.low, self.high)  # type: ignore[arg-type]
        elif self.type is float:
            check_float(self.name, value, self.low, self.high)  # type: ignore[arg-type]
        elif value not in self.choices:
            *head, last = (repr(c) for c in self.choices)
            allowed = f"{', '.join(head)} or {last}" if head else last
            raise ValueError(f"{self.name}: expected {allowed}, got {value!r}")
        if self.above_low and value == self.low:
            raise ValueError(f"{self.name}: must be > {self.low:g}, got {value:g}")


def check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    """An int (not a bool) in [low, high]; the error names the field and the bound."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")


def check_float(name: str, value: Any, low: float, high: float) -> None:
    """A finite number (int or float, not a bool, not NaN) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    if not (low <= value <= high) or value != value:
        raise ValueError(f"{name}: must be in [{low}, {high}], got {value}")
