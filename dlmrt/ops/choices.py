"""The one registry of implementation choices: every start-up decision of which implementation
runs (an op's Triton kernel or torch twin, FlashAttention-4 or our arena kernel, an attention
tile, FP8 or bf16 GEMMs, the fused FP8 and bf16 GLUs, NVFP4 kernels, W8A8 or W8A16 experts,
whether a model's quantized weights run on its kernels, one or two streams for independent
branches: `ops/branches.py`, DLMRT_BRANCH_STREAMS) is recorded here under a key saying what was
decided, logged once at INFO, and can be read back (`report()`: `dlmrt generate -v`, the
benchmarks, the tests).

The measurements stay beside what they measure (`ops/fp8_choice.py`, `ops/fp8_glu_choice.py`,
`ops/bf16_glu_choice.py`, `ops/nvfp4_choice.py`, `ops/moe_fp8_choice.py`, `ops/flash_attn4.py`);
they decide through `record`. The environment pins (DLMRT_OPS, DLMRT_FA4, DLMRT_FP8_GEMMS,
DLMRT_FP8_GEMM_KERNEL, DLMRT_FP8_GLU, DLMRT_BF16_GLU, DLMRT_FP8_EXPERTS, DLMRT_NVFP4_EXPERTS,
DLMRT_NVFP4_DENSE, DLMRT_VOCAB_PASS, DLMRT_DEEPGEMM, DLMRT_CANVAS_VOCAB, DLMRT_CANVAS_ATTN) are
read by those deciders (DLMRT_VOCAB_PASS and DLMRT_CANVAS_VOCAB by `engine/block/vocab_step.py`
and `engine/encoder_decoder/vocab_choice.py`, DLMRT_CANVAS_ATTN by `ops/canvas_launch.py`), and a
pinned choice says so in its `why`. DLMRT_PDL, a switch rather than a choice between
implementations, is recorded by `dlmrt.ops` when it sets the kernels' switch.

A key is recorded once: recording the same pick and reason again is a lookup (nothing logged);
a different pick or reason under the same key (a pin changed between two models of one
process: tests, benchmarks) replaces the record and is logged as the new choice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger("dlmrt")


@dataclass(frozen=True, slots=True)
class Choice:
    """One decision: `what` was decided (the key), the `pick`, `why` (a pin, the device, or the
    measurement in words), and the measured `options` (option -> GPU µs; empty when unmeasured)."""

    what: str
    pick: str
    why: str
    options: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        """The log line and the report's row: "what: pick (why)"."""
        return f"{self.what}: {self.pick} ({self.why})" if self.why else f"{self.what}: {self.pick}"


_CHOICES: dict[str, Choice] = {}


def record(what: str, pick: str, why: str = "", options: dict[str, float] | None = None) -> Choice:
    """Record the choice `pick` for `what` (logged at INFO the first time it is recorded, or when
    it changes); returns the record in force."""
    old = _CHOICES.get(what)
    if old is not None and old.pick == pick and old.why == why:
        return old
    choice = Choice(what, pick, why, dict(options or {}))
    _CHOICES[what] = choice
    log.info("%s", choice.line())
    return choice


def get(what: str) -> Choice | None:
    """The choice recorded for `what`, or None."""
    return _CHOICES.get(what)


def recorded(prefix: str = "") -> list[Choice]:
    """The choices recorded so far whose key starts with `prefix`, in the order first recorded."""
    return [c for what, c in _CHOICES.items() if what.startswith(prefix)]


def report(prefix: str = "") -> str:
    """The recorded choices, one "what: pick (why)" line each (empty string when none)."""
    return "\n".join(c.line() for c in recorded(prefix))


def forget(prefix: str = "") -> None:
    """Drop the records whose key starts with `prefix` (all by default): tests, and `ops.use`."""
    for what in [w for w in _CHOICES if w.startswith(prefix)]:
        del _CHOICES[what]
