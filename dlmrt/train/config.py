"""TrainConfig: every knob of an SFT run (frozen; `dlmrt train sft` flags derive from the fields).

The defaults train the shipped demo model (`dlmrt/assets/demo`, its model card says how well it
does): a QwenDLM-format (SDAR) model of 4.85M parameters, hidden 256, 6 layers, 4 query / 2 KV
heads of 64, SwiGLU 768, tied embeddings, block size 16, on the arithmetic task with a 512-token
BPE tokenizer, 8000 steps of 32768-token packs (about 6 minutes on one H200).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# Fields that may change when a run is resumed: they do not change the examples, the noise or the
# update rule (attention and precision change rounding only; `steps` reshapes the cosine tail).
RESUMABLE = (
    "steps",
    "device",
    "data_workers",
    "attention",
    "precision",
    "eval_every",
    "eval_problems",
    "save_every",
    "keep_checkpoints",
    "log_every",
)


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


def check_finite(config: Any) -> None:
    """Every float field of the dataclass `config` finite: a NaN or inf learning rate (or decay,
    beta, clip...) passes every `<` check and would fail late, or train NaN weights."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{f.name}: must be a finite number, got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    task: str = _f("arithmetic", "training task (dlmrt.tasks)")
    seed: int = _f(0, "seed of the initial weights and of every step's noise")
    steps: int = _f(8000, "optimizer steps")
    device: str | None = _f(None, "cpu | cuda | cuda:N; None: cuda if available")
    init_from: str | None = _f(
        None,
        "model directory whose weights start the run instead of random ones (same shape flags "
        "and task; e.g. a Base continued at another --block-size); None: random init",
    )
    # model (QwenDLM / SDAR format)
    hidden_size: int = _f(256, "model width")
    intermediate_size: int = _f(768, "SwiGLU width")
    num_hidden_layers: int = _f(6, "decoder layers")
    num_attention_heads: int = _f(4, "query heads")
    num_key_value_heads: int = _f(2, "key/value heads (GQA)")
    head_dim: int = _f(64, "per-head width")
    block_size: int = _f(16, "diffusion block length B")
    max_position_embeddings: int = _f(1024, "longest prompt + response the model accepts")
    rope_theta: float = _f(10000.0, "RoPE base")
    vocab_size: int = _f(512, "tokenizer size at most (the model rounds it up to a multiple of 64)")
    tokenizer_problems: int = _f(20000, "train problems the tokenizer is trained on")
    # data and loss
    pack_rows: int | None = _f(
        None,
        "rows (tokens) of one packed forward, clean and noisy copies of whole examples; "
        "None: 32768 on CUDA, 512 on CPU",
    )
    grad_accum: int | None = _f(
        None, "packed forwards per optimizer step; None: 1 on CUDA, 8 on CPU"
    )
    data_workers: int | None = _f(
        None, "processes building packs ahead; None: min(8, CPUs - 2) on CUDA, 0 on CPU"
    )
    chat_fraction: float = _f(0.5, "fraction of examples in the chat template (the rest raw)")
    loss_weighting: str = _f(
        "mean",
        "mean: CE averaged over masked tokens (TraDo/SDAR SFT); elbo: each masked token "
        "weighted 1/t (t = its block's mask ratio), summed over response tokens / their count",
    )
    # optimisation
    lr: float = _f(1e-3, "peak learning rate (AdamW)")
    min_lr_ratio: float = _f(0.1, "cosine floor as a fraction of lr")
    warmup_steps: int = _f(100, "linear warm-up steps")
    weight_decay: float = _f(0.1, "AdamW weight decay on matrices (not on norms or embeddings)")
    beta1: float = _f(0.9, "AdamW beta1")
    beta2: float = _f(0.95, "AdamW beta2")
    grad_clip: float = _f(1.0, "max global gradient norm (0: off)")
    precision: str = _f("auto", "auto | bf16 | fp32; auto: bf16 autocast on CUDA, fp32 on CPU")
    attention: str = _f("auto", "auto | flex | dense; auto: flex on CUDA, dense mask on CPU")
    # evaluation, checkpoints, logging
    eval_every: int = _f(2000, "steps between evaluations (and at the last step; 0: never)")
    eval_problems: int = _f(200, "held-out problems per evaluation")
    eval_threshold: float = _f(0.9, "evaluation decoder: the threshold rule's tau")
    eval_max_new_tokens: int = _f(128, "evaluation: generated tokens at most")
    save_every: int = _f(1000, "steps between checkpoints (and at the last step)")
    keep_checkpoints: int = _f(2, "checkpoints kept under OUT/checkpoints")
    log_every: int = _f(10, "steps per JSONL log line (mean loss over them)")

    def __post_init__(self) -> None:
        from dlmrt.tasks import get_task

        get_task(self.task)
        check_finite(self)
        for name in (
            "steps",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "block_size",
            "max_position_embeddings",
            "tokenizer_problems",
            "eval_problems",
            "eval_max_new_tokens",
            "save_every",
            "keep_checkpoints",
            "log_every",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}: must be a positive integer, got {getattr(self, name)!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads: must divide num_attention_heads")
        if self.pack_rows is not None and self.pack_rows < self.block_size:
            raise ValueError(f"pack_rows: must be >= block_size, got {self.pack_rows}")
        if self.data_workers is not None and self.data_workers < 0:
            raise ValueError(f"data_workers: must be >= 0, got {self.data_workers}")
        if self.grad_accum is not None and self.grad_accum < 1:
            raise ValueError(f"grad_accum: must be >= 1, got {self.grad_accum}")
        if not 0.0 <= self.chat_fraction <= 1.0:
            raise ValueError(f"chat_fraction: must be in [0, 1], got {self.chat_fraction}")
        if not 0.0 <= self.eval_threshold <= 1.0:
            raise ValueError(f"eval_threshold: must be in [0, 1], got {self.eval_threshold}")
        if self.lr <= 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):  # AdamW's own check would come after the run directory
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}: must be in [0, 1), got {getattr(self, name)}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay}")
        if self.warmup_steps < 0 or self.eval_every < 0 or self.grad_clip < 0:
            raise ValueError("warmup_steps, eval_every and grad_clip must be >= 0")
        if self.loss_weighting not in ("mean", "elbo"):
            raise ValueError(f"loss_weighting: expected mean or elbo, got {self.loss_weighting!r}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision: expected auto, bf16 or fp32, got {self.precision!r}")
        if self.attention not in ("auto", "flex", "dense"):
            raise ValueError(f"attention: expected auto, flex or dense, got {self.attention!r}")

    def batch_shape(self, device_type: str) -> tuple[int, int]:
        """(pack_rows, grad_accum) with the per-device defaults filled in."""
        cuda = device_type == "cuda"
        rows = self.pack_rows or (32768 if cuda else 512)
        return rows, self.grad_accum or (1 if cuda else 8)

    @classmethod
    def load(cls, path: Path) -> TrainConfig:
        raw = json.loads(path.read_text())
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown TrainConfig field(s) {unknown}")
        return cls(**raw)

    def hf_config(self, vocab_size: int, specials: dict[str, int]) -> dict[str, Any]:
        """The model's `config.json` (SDARForCausalLM; parsed by dlmrt's own config reader)."""
        return {
            "architectures": ["SDARForCausalLM"],
            "model_type": "sdar",
            "vocab_size": vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": 1e-6,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": True,
            "block_size": self.block_size,
            "bos_token_id": specials["<|endoftext|>"],
            "eos_token_id": specials["<|endoftext|>"],
            "pad_token_id": specials["<|endoftext|>"],
            "mask_token_id": specials["<|MASK|>"],
            "torch_dtype": "float32",
        }
