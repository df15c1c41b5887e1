"""ORLConfig: every knob of an ORL run (frozen; `dlmrt train orl` flags and recipes derive from it).

Defaults in brackets in issue 16 / the paper (Appendices C-E) are kept: 1 prompt x 8 rollouts per
step, the top 25% of states by accepted tokens plus each block's final state, adapter lr 0.3x,
new-adapter gate/up ~ N(0, 1e-3) with a zero down projection, AEC gate H_roll <= 0.20
(QwenDLM), entropy-gated CE + capped reverse KL off by default (zeta 0.10, C 5). The paper gives
no value for rho, lambda_AEC or the learning rate: ours are documented in docs/orl-training.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dlmrt.config import MODES
from dlmrt.params import check_temperature
from dlmrt.rules import KNOBS, RULE_NAMES, knob_help
from dlmrt.train.config import check_finite

# Fields that may change on resume: they change neither the rollouts nor the update rule.
RESUMABLE = (
    "steps",
    "device",
    "attention",
    "precision",
    "eval_every",
    "eval_problems",
    "save_every",
    "keep_checkpoints",
    "verifier_workers",
    "check_replay",
    "rollout_mode",
)


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


def _knob(name: str) -> Any:
    """A rollout decoder knob: its help and (in __post_init__) its checks as declared with its
    rule in dlmrt/rules.py; None: the model's default."""
    return _f(None, "rollouts: " + knob_help(KNOBS[name]))


@dataclass(frozen=True, slots=True, kw_only=True)
class ORLConfig:
    model: str | None = _f(None, "start checkpoint (QwenDLM format); None: the shipped demo model")
    task: str = _f("arithmetic", "training task with a verifier: arithmetic | math | code")
    data: str | None = _f(
        None, "tasks math and code: a JSONL (GSM8K / HumanEval format, as bench; or humaneval)"
    )
    seed: int = _f(0, "seed of the prompt order, the rollouts' sampling and a new adapter")
    steps: int = _f(200, "training steps (one rollout batch each)")
    device: str | None = _f(None, "cpu | cuda | cuda:N; None: cuda if available")
    # start model
    gamma: float | None = _f(
        None, "rescale an existing adapter by gamma once (paper: 8); None: off"
    )
    adapter_intermediate_size: int | None = _f(
        None, "width of a newly added adapter; None: the model's intermediate_size"
    )
    adapter_init_std: float = _f(1e-3, "a new adapter's gate/up init std (down starts at zero)")
    adapter_positions: str = _f("masked", "a new adapter's rows: masked | block")
    adapter_post_norm_scale: float | None = _f(
        None,
        "a new adapter's post-norm s (h = s RMSNorm(E[x] + g(z)) on the block's rows; "
        "docs/orl-training.md); None: no post-norm",
    )
    # rollouts
    prompts_per_step: int = _f(1, "prompts B per step (spread over data-parallel ranks)")
    rollouts_per_prompt: int = _f(8, "rollouts G per prompt")
    temperature: float = _f(1.0, "rollout sampling temperature (0: greedy)")
    rule: str | None = field(
        default=None,
        metadata={
            "help": "rollout rule; None: the model's ORL rule (entropy_budget)",
            "choices": RULE_NAMES,
        },
    )
    entropy_budget: float | None = _knob("entropy_budget")
    threshold: float | None = _knob("threshold")
    max_new_tokens: int = _f(96, "generated tokens per rollout at most")
    chat_fraction: float = _f(0.5, "fraction of prompts in the chat template (by problem seed)")
    rollout_mode: str = _f(
        "auto",
        "engine mode of the rollouts: auto | eager | round_graph | block_graph; auto: "
        "block_graph on CUDA, eager on the CPU (states are captured in every mode)",
    )
    rollout_refresh: int = _f(
        1,
        "steps between copies of the trained weights into the rollout model; 1: on-policy (the "
        "rollouts run the trained model itself); N > 1: a frozen snapshot refreshed every N steps "
        "(the paper's off-policy ablation)",
    )
    capture_limit: int = _f(100000, "captured states per step at most (more: a clear error)")
    verifier_workers: int = _f(2, "verifier processes (0: verify in the trainer process)")
    # selection and losses
    select_fraction: float = _f(0.25, "per block: the share of states accepting the most tokens")
    aec_weight: float = _f(1.0, "lambda_AEC")
    aec_rho: float = _f(0.2, "rho: the target entropy contraction per step")
    aec_gate: float | None = _f(0.2, "AEC pairs need H_roll(source) <= this (QwenDLM); None: all")
    entropy_gate: bool = _f(False, "entropy-gated CE + capped reverse KL (the final stage)")
    zeta: float = _f(0.10, "entropy gate: CE where the rollout's normalised entropy > zeta")
    rkl_cap: float = _f(5.0, "C: cap of the per-position reverse KL")
    # optimisation
    lr: float = _f(1e-5, "backbone learning rate (AdamW, constant after warm-up)")
    adapter_lr_scale: float = _f(0.3, "adapter learning rate / backbone learning rate")
    adapter_adam_eps: float = _f(
        1e-15,
        "AdamW eps of the adapter's parameters: far below their second moments (sqrt(v) ~ 6e-9 "
        "for a fresh adapter's W_g / W_u), so it does not damp their steps; the backbone keeps "
        "torch's 1e-8",
    )
    warmup_steps: int = _f(0, "linear warm-up (optimizer steps)")
    weight_decay: float = _f(0.0, "AdamW weight decay on matrices")
    beta1: float = _f(0.9, "AdamW beta1")
    beta2: float = _f(0.95, "AdamW beta2")
    grad_clip: float = _f(1.0, "max global gradient norm (0: off)")
    precision: str = _f("auto", "auto | bf16 | fp32; auto: bf16 autocast on CUDA, fp32 on CPU")
    attention: str = _f("auto", "auto | flex | dense; auto: flex on CUDA, dense mask on CPU")
    pack_tokens: int = _f(4096, "tokens of one packed replay row at most")
    # evaluation, checkpoints, diagnostics
    eval_every: int = _f(0, "steps between held-out evaluations (and the last step; 0: never)")
    eval_problems: int = _f(50, "held-out problems per evaluation")
    save_every: int = _f(10, "steps between checkpoints (and at the last step)")
    keep_checkpoints: int = _f(2, "checkpoints kept under OUT/checkpoints")
    check_replay: bool = _f(False, "log max |replayed - rollout logits| of the first state")

    def __post_init__(self) -> None:
        from dlmrt.train.orl.tasks import FILE_TASKS, NAMES

        if self.task not in NAMES:
            raise ValueError(f"task: unknown task {self.task!r} (choose from {', '.join(NAMES)})")
        if (self.task in FILE_TASKS) != (self.data is not None):
            raise ValueError("data: needed by the tasks math and code (a JSONL file), only by them")
        check_finite(self)  # before any run directory is written
        check_temperature(self.temperature)  # the rollouts' sampling temperature
        for name in (
            "steps",
            "prompts_per_step",
            "rollouts_per_prompt",
            "max_new_tokens",
            "capture_limit",
            "rollout_refresh",
            "pack_tokens",
            "eval_problems",
            "save_every",
            "keep_checkpoints",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        checks = (
            ("select_fraction", 0.0 <= self.select_fraction <= 1.0, "in [0, 1]"),
            ("aec_rho", 0.0 <= self.aec_rho <= 1.0, "in [0, 1]"),
            ("chat_fraction", 0.0 <= self.chat_fraction <= 1.0, "in [0, 1]"),
            ("aec_weight", self.aec_weight >= 0, ">= 0"),
            ("lr", self.lr > 0, "> 0"),
            ("adapter_lr_scale", self.adapter_lr_scale >= 0, ">= 0"),
            ("adapter_adam_eps", self.adapter_adam_eps > 0, "> 0"),
            ("rkl_cap", self.rkl_cap > 0, "> 0"),
            ("gamma", self.gamma is None or self.gamma > 0, "> 0"),
            ("adapter_post_norm_scale", _positive_or_none(self.adapter_post_norm_scale), "> 0"),
            ("grad_clip", self.grad_clip >= 0, ">= 0"),
            ("beta1", 0.0 <= self.beta1 < 1.0, "in [0, 1)"),
            ("beta2", 0.0 <= self.beta2 < 1.0, "in [0, 1)"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
            ("eval_every", self.eval_every >= 0, ">= 0"),
            ("verifier_workers", self.verifier_workers >= 0, ">= 0"),
        )
        for name, ok, want in checks:
            if not ok:
                raise ValueError(f"{name}: must be {want}, got {getattr(self, name)!r}")
        if self.check_replay and self.rollout_refresh > 1:
            raise ValueError(
                "check_replay: needs rollout_refresh = 1 (a snapshot's rollouts are "
                "not the trained weights' logits)"
            )
        for name in DECODER_KNOBS:
            KNOBS[name].check(getattr(self, name))
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(self, name)!r}")

    @classmethod
    def load(cls, path: Path) -> ORLConfig:
        return cls.from_dict(json.loads(path.read_text()), str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str) -> ORLConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{where}: unknown ORLConfig field(s) {unknown}")
        return cls(**raw)


# The rules' knobs an ORL run sets for its rollouts (fields above, besides `rule`).
DECODER_KNOBS = tuple(f.name for f in fields(ORLConfig) if f.name in KNOBS)
CHOICES = {
    "precision": ("auto", "bf16", "fp32"),
    "attention": ("auto", "flex", "dense"),
    "adapter_positions": ("masked", "block"),
    "rollout_mode": MODES,
}


def _positive_or_none(value: float | None) -> bool:
    return value is None or 0 < value < float("inf")
