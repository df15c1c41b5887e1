"""`entropy_bound_canvas`: DiffusionGemma's decoder (transformers' `DiffusionGemmaGenerationMixin`).

A canvas of `canvas_length` uniform-random tokens is refined for at most N = `max_denoising_steps`
steps. Step k (counting N down to 1) divides the softcapped logits by T = t_min + (t_max - t_min)
* k / N, samples one token per row from softmax(logits / T), and accepts the rows of lowest
entropy while sum(H) - max(H) <= `entropy_bound` over the accepted set (sorted ascending: the
exclusive prefix sum of H, computed as transformers does, cumsum - H). Accepted rows take their
sample, every other row a fresh uniform-random token (nothing is frozen). The canvas is done when
its argmax equals the argmax of each of the previous `stability_threshold` steps and the mean row
entropy is below `confidence_threshold`, or after N steps; the committed tokens are the argmax
canvas. The next step's self-conditioning input is this step's tempered logits.

Everything here is a pure function of device tensors (no host sync). Random draws come from a
`CanvasNoise`: `TorchNoise` draws from a seeded `torch.Generator` in transformers' order (canvas
init; per step one multinomial, then one re-noise canvas), token-identical to transformers'
`generate` after `torch.manual_seed(seed)` on the same device; `CounterNoise` hashes (seed,
canvas, step, row) like the other rules' sampling noise, so a CUDA graph can replay it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from dlmrt.decoding.noise import counter_uniform
from dlmrt.errors import CheckpointError
from dlmrt.rules import KNOBS

log = logging.getLogger("dlmrt")

RNG_MODES: tuple[str, ...] = KNOBS["rng"].choices
# generation_config.json's `sampler_config` is a transformers sampler class's fields plus its name
# (`_cls_name`): the classes dlmrt runs, each field mapped to the CanvasSettings field it sets.
SAMPLERS: dict[str, dict[str, str]] = {
    "EntropyBoundSamplerConfig": {"entropy_bound": "entropy_bound"}
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CanvasSettings:
    """The canvas decoder's knobs. Defaults: their fallbacks, declared with the rule in
    dlmrt/rules.py (transformers' global defaults); a request's `DecodeParams` overrides them."""

    max_denoising_steps: int = KNOBS["max_denoising_steps"].fallback
    entropy_bound: float = KNOBS["entropy_bound"].fallback
    t_min: float = KNOBS["t_min"].fallback
    t_max: float = KNOBS["t_max"].fallback
    stability_threshold: int = KNOBS["stability_threshold"].fallback
    confidence_threshold: float = KNOBS["confidence_threshold"].fallback

    def __post_init__(self) -> None:
        if self.max_denoising_steps < 1:
            raise ValueError(f"max_denoising_steps: must be >= 1, got {self.max_denoising_steps}")
        if not self.entropy_bound > 0:
            raise ValueError(f"entropy_bound: must be > 0, got {self.entropy_bound}")
        if not (self.t_min > 0 and self.t_max > 0):
            raise ValueError(f"t_min, t_max: must be > 0, got {self.t_min}, {self.t_max}")
        if self.stability_threshold < 0:
            raise ValueError(f"stability_threshold: must be >= 0, got {self.stability_threshold}")

    @classmethod
    def from_generation_config(
        cls, gen: dict[str, Any], where: Path, role: str | None
    ) -> CanvasSettings:
        """Settings of a checkpoint's parsed generation_config.json (`gen`, read from `where`,
        the path errors name) over the defaults; role "orl" then applies its "orl" section (the
        ORL decoder recorded with the checkpoint) when there is one."""
        settings = replace(cls(), **_known(gen, where))
        if role == "orl":
            if isinstance(gen.get("orl"), dict):
                settings = replace(settings, **_known(gen["orl"], where))
            else:
                log.warning(
                    "%s: role 'orl' but it records no 'orl' decoder settings; using the base "
                    "decoder's",
                    where,
                )
        return settings


def _known(gen: dict[str, Any], where: Path) -> dict[str, Any]:
    names = {f.name for f in fields(CanvasSettings)}
    out = {k: v for k, v in gen.items() if k in names and v is not None}
    out.update(sampler_settings(gen.get("sampler_config"), where))
    for name, value in out.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: {name} must be a number")
    return out


def sampler_settings(sampler: Any, where: Path) -> dict[str, Any]:
    """The CanvasSettings fields a `sampler_config` sets (null: none). Its `_cls_name` must be one
    of SAMPLERS (a hand-written one without it is read as EntropyBoundSamplerConfig's fields); an
    unknown class, or a field its class does not have, is a CheckpointError naming it."""
    if sampler is None:
        return {}
    if not isinstance(sampler, dict):
        raise CheckpointError(f"{where}: 'sampler_config' must be an object, got {sampler!r}")
    given = dict(sampler)
    name = given.pop("_cls_name", "EntropyBoundSamplerConfig")
    if name not in SAMPLERS:
        raise CheckpointError(
            f"{where}: sampler_config class {name!r} is not supported "
            f"(dlmrt runs {', '.join(SAMPLERS)})"
        )
    unknown = sorted(set(given) - set(SAMPLERS[name]))
    if unknown:
        raise CheckpointError(f"{where}: sampler_config {name} has no field(s) {unknown}")
    return {SAMPLERS[name][k]: v for k, v in given.items() if v is not None}


def temperature(
    settings: CanvasSettings, step: int | torch.Tensor, device: torch.device | None = None
) -> torch.Tensor:
    """T at `step` (counting max_denoising_steps down to 1): t_max first, then linearly lower.

    An fp32 device scalar computed as transformers does (int32 step / N in fp32), so the tempered
    logits round the same. `step` may be a device tensor (the graph modes' step counter)."""
    s = settings
    if isinstance(step, torch.Tensor):
        frac = step.to(torch.int32) / s.max_denoising_steps
    else:
        frac = torch.tensor(step, dtype=torch.int32, device=device) / s.max_denoising_steps
    return s.t_min + (s.t_max - s.t_min) * frac


def token_entropy(z: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(z) per row, with torch.distributions.Categorical's exact operations."""
    logp = z - z.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(logp, dim=-1)
    return -(logp.clamp(min=torch.finfo(logp.dtype).min) * probs).sum(-1)


def accept(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """Bool [rows]: the lowest-entropy rows whose sum(H) - max(H) stays <= bound (>= 1 row)."""
    sorted_h, order = torch.sort(entropy, dim=-1, descending=False)
    keep = torch.cumsum(sorted_h, dim=-1) - sorted_h <= bound
    return torch.zeros_like(keep).scatter(-1, order, keep)


def is_stable(history: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """history [S, rows] holds the previous S argmax canvases (-1 before the first steps)."""
    return (history == argmax.unsqueeze(0)).all()


def push(history: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    return torch.cat((history[1:], argmax.unsqueeze(0))) if history.shape[0] else history


class TorchNoise:
    """transformers' draws from one seeded generator: randint canvases, multinomial samples."""

    def __init__(self, seed: int, vocab: int, device: torch.device) -> None:
        self.gen = torch.Generator(device).manual_seed(seed)
        self.vocab = vocab

    def canvas(self, rows: int, index: int, step: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (rows,), generator=self.gen, device=self.gen.device)

    def sample(self, probs: torch.Tensor, index: int, step: int) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.gen).squeeze(-1)


class CounterNoise:
    """Uniforms hashed from (seed, canvas index, draw) per row: graph-replayable, device-independent.

    Canvas draws map u to floor(u * vocab); samples invert the CDF of probs (first token whose
    cumulative probability exceeds u, as the other rules' sampling does)."""

    def __init__(self, seed: int, vocab: int, device: torch.device) -> None:
        self.seed = torch.tensor(seed, dtype=torch.int64, device=device)
        self.vocab = vocab

    def _t(self, value: int) -> torch.Tensor:
        return torch.full_like(self.seed, value)

    def canvas(self, rows: int, index: int, step: int) -> torch.Tensor:
        return counter_canvas(self.seed, self._t(index), self._t(step), rows, self.vocab)

    def sample(self, probs: torch.Tensor, index: int, step: int) -> torch.Tensor:
        return counter_sample(probs, self.seed, self._t(index), self._t(step))


# CounterNoise's draws with device-scalar (int64) seed, canvas index and step: the static path
# (engine/canvas_static.py) calls these with its device counters, so graphs replay them.
def counter_canvas(
    seed: torch.Tensor, index: torch.Tensor, step: torch.Tensor, rows: int, vocab: int
) -> torch.Tensor:
    u = counter_uniform(seed, index, 2 * step + 1, rows)
    return (u * vocab).long().clamp_(max=vocab - 1)


def counter_sample(
    probs: torch.Tensor, seed: torch.Tensor, index: torch.Tensor, step: torch.Tensor
) -> torch.Tensor:
    cdf = torch.cumsum(probs, dim=-1)
    target = (counter_uniform(seed, index, 2 * step, probs.shape[0]) * cdf[:, -1]).unsqueeze(-1)
    tokens = torch.searchsorted(cdf, target.contiguous(), right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


def make_noise(rng: str, seed: int, vocab: int, device: torch.device) -> TorchNoise | CounterNoise:
    if rng not in RNG_MODES:
        raise ValueError(f"rng: expected one of {', '.join(RNG_MODES)}, got {rng!r}")
    return (TorchNoise if rng == "torch" else CounterNoise)(seed, vocab, device)
