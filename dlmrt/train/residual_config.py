"""WarmupConfig: the settings of `dlmrt train residual` (dlmrt/train/residual_warmup.py). No torch
import here: `dlmrt --help` builds its flags from this dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WarmupConfig:
    model: str | None = field(
        default=None,
        metadata={
            "help": "Base checkpoint (QwenDLM format; an adapter is added unless it has "
            "one); None: the shipped demo model"
        },
    )
    task: str = field(default="sum_set_small", metadata={"help": "procedural task of the SFT rows"})
    steps: int = field(default=400, metadata={"help": "optimizer steps (one packed row each)"})
    lr: float = field(default=1e-5, metadata={"help": "backbone learning rate (0: frozen)"})
    adapter_lr: float = field(
        default=1e-4,  # docs/orl-demo.md: 3e-4 and up take the ratio past 2 and cost accuracy
        metadata={"help": "the adapter's learning rate"},
    )
    adapter_adam_eps: float = field(
        default=1e-15, metadata={"help": "AdamW eps of the adapter group (its moments are tiny)"}
    )
    down_init_std: float = field(
        default=1e-3,
        metadata={
            "help": "a fresh adapter's W_d ~ N(0, std) (0: the zero init, no gradient to "
            "W_g / W_u until W_d grows)"
        },
    )
    post_norm_scale: float | None = field(
        default=None,
        metadata={
            "help": "a fresh adapter's post-norm s: every block row's input becomes "
            "s RMSNorm(E[x] + g(z)), which bounds the residual (the paper's QwenDLM form); pick s "
            "near the Base's embedding RMS (docs/orl-training.md); None: no post-norm"
        },
    )
    rows: int = field(default=1024, metadata={"help": "rows of a packed SFT row"})
    passes: int = field(
        default=1,
        metadata={
            "help": "passes with z per step: 1, z from the z = 0 pass; more, each next z from "
            "the previous pass, which had z (the engine's later rounds)"
        },
    )
    seed: int = field(default=0, metadata={"help": "data, noise and acceptance seed"})
    device: str | None = field(
        default=None, metadata={"help": "cpu | cuda | cuda:N; None: cuda if available"}
    )
    log_every: int = field(default=10, metadata={"help": "steps between log lines"})

    def __post_init__(self) -> None:
        for name in ("steps", "rows", "passes", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "adapter_lr", "adapter_adam_eps", "down_init_std"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise ValueError(f"{name}: must be finite and >= 0, got {getattr(self, name)}")
        if self.post_norm_scale is not None and not 0 < self.post_norm_scale < float("inf"):
            raise ValueError(f"post_norm_scale: must be > 0, got {self.post_norm_scale}")
