"""The ORL residual pathway (`docs/checkpoint-format.md`: the `orl_residual` block).

    z_i  = p_i^T E                         pre-adapter residual from the previous round's logits
    u    = s_in * RMSNorm_w(z)
    g(z) = s_out * W_d[SiLU(W_g u) * (W_u u)]
    h_i  = post(E[x_i] + alpha * m_i * g(z_i))

with m_i = 1 on the rows that receive the residual (`positions`) and post = s * RMSNorm_nonaffine
when `post_norm_scale` is a number s, else the identity. g(0) = 0: RMSNorm(0) = 0 and every
projection is bias-free, so a block's first round (z = 0) is an ordinary masked forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dlmrt import ops
from dlmrt.account import label
from dlmrt.errors import CheckpointError
from dlmrt.models.layers import GeGLU, GemmaRMSNorm, RMSNorm, SwiGLU
from dlmrt.ops.reference import rms_normalize
from dlmrt.parallel import group as tp
from dlmrt.parallel import vocab

POST_NORM_EPS = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidualConfig:
    """The `orl_residual` block of `config.json`."""

    intermediate_size: int
    input_scale: float = 1.0
    output_scale: float = 1.0
    strength: float = 1.0
    post_norm_scale: float | None = None
    positions: str = "masked"
    temperature: float = 1.0
    norm_eps: float = 1e-6

    @staticmethod
    def from_hf(raw: Any, path: Path) -> ResidualConfig:
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: config field 'orl_residual' must be an object")
        known = set(ResidualConfig.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise CheckpointError(f"{path}: unknown field(s) in 'orl_residual': {unknown}")
        if "intermediate_size" not in raw:
            raise CheckpointError(
                f"{path}: missing required config field 'orl_residual.intermediate_size'"
            )
        for name, value in raw.items():
            _check_type(path, name, value)
        cfg = ResidualConfig(**raw)
        if cfg.positions not in ("masked", "block"):
            raise CheckpointError(
                f"{path}: 'orl_residual.positions' must be 'masked' or 'block', got {cfg.positions!r}"
            )
        if cfg.temperature <= 0:
            raise CheckpointError(f"{path}: 'orl_residual.temperature' must be > 0")
        if cfg.post_norm_scale is not None and cfg.post_norm_scale <= 0:
            raise CheckpointError(f"{path}: 'orl_residual.post_norm_scale' must be > 0 or null")
        return cfg


_TYPES = {"intermediate_size": int, "positions": str, "post_norm_scale": (int, float, type(None))}


def _check_type(path: Path, name: str, value: Any) -> None:
    kind = _TYPES.get(name, (int, float))
    bad_float = isinstance(value, float) and not math.isfinite(value)
    if isinstance(value, bool) or not isinstance(value, kind) or bad_float:
        raise CheckpointError(
            f"{path}: config field 'orl_residual.{name}' has the wrong type ({value!r})"
        )


class ResidualAdapter(SwiGLU):
    """g(z): weighted RMSNorm, input scale, the bias-free SwiGLU MLP, output scale."""

    def __init__(self, hidden_size: int, cfg: ResidualConfig) -> None:
        super().__init__(hidden_size, cfg.intermediate_size)
        self.cfg = cfg
        self.input_scale = cfg.input_scale
        self.output_scale = cfg.output_scale
        self.norm = RMSNorm(hidden_size, cfg.norm_eps)

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # z: [rows, hidden]
        return self.output_scale * super().forward(self.input_scale * self.norm(z))

    def receives(self, unresolved: torch.Tensor) -> torch.Tensor:
        """The rows m that get alpha * g(z): the unresolved rows ("masked") or every row of the
        block ("block"). Device-side, no host sync (graph-capturable)."""
        if self.cfg.positions == "block":
            return torch.ones_like(unresolved)
        return unresolved

    @torch.no_grad()
    def switch_off(self) -> None:
        """g(z) = 0 from now on (the adapter-off ablation): W_d is zeroed in place. In place, not
        a zero output scale, because graph modes capture a Python scale as a constant but read
        the weight's storage at every replay: this holds before and after a capture. What is
        left is the model without its residual pathway (h = post(E[x]))."""
        self.down_proj.weight.zero_()

    @property
    def filled_block_is_clean(self) -> bool:
        """Whether a forward of a block with no unresolved rows is a clean forward (h = E[x]):
        true for "masked" rows (m = 0 everywhere, so h = E[x] + 0) without a post-norm; false
        when z enters every row or the post-norm rescales E[x]. Commit folding asks this
        (`dlmrt/engine/block/fold.py`): only then can an editing rule's post-fill check double as
        the block's commit."""
        return self.cfg.positions == "masked" and self.cfg.post_norm_scale is None

    def inject(
        self,
        tok_emb: torch.Tensor,
        z: torch.Tensor,
        receives: torch.Tensor,
        g: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return h = post(E[x] + alpha * m * g(z)); `receives` is the bool row mask m: [rows].
        `g`: g(z) when the caller has already computed it (the ORL replay keeps it for its
        diagnostics, `dlmrt/train/orl/residual_probe.py`), else computed here."""
        with label("orl_inject", tok_emb, z):
            m = receives.to(tok_emb.dtype).unsqueeze(-1)
            h = tok_emb + self.cfg.strength * m * (self.forward(z) if g is None else g)
            if self.cfg.post_norm_scale is not None:
                h = self.cfg.post_norm_scale * rms_normalize(h, POST_NORM_EPS)
            return h

    def inject_tail(self, h: torch.Tensor, z: torch.Tensor, receives: torch.Tensor) -> torch.Tensor:
        """`inject` on the last z.shape[0] rows of h: the block being denoised. Rows before it are
        clean context and keep h = E[x]."""
        n = z.shape[0]
        tail = self.inject(h[-n:], z, receives)
        return tail if n == h.shape[0] else torch.cat((h[:-n], tail), dim=0)


class SelfConditioning(GeGLU):
    """DiffusionGemma's native self-conditioning (transformers' `DiffusionGemma` self-conditioning block), on every canvas row:

        u  = RMSNorm_w(soft)                       `pre_norm`, with weight
        sc = W_d[gelu_tanh(W_g u) * (W_u u)]       bias-free GeGLU
        h  = RMSNorm_noweight(tok_emb + sc)        `post_norm`, no weight

    with soft = softmax(previous logits) @ E * sqrt(hidden) (the scaled soft embedding, see
    `soft_embedding`). soft = None (a canvas's first step) means soft = 0, so sc = 0 exactly.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, eps: float) -> None:
        super().__init__(hidden_size, intermediate_size)
        self.pre_norm = GemmaRMSNorm(hidden_size, eps)
        self.eps = eps

    def inject(
        self, tok_emb: torch.Tensor, soft: torch.Tensor | None, first: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`first` (a device bool, for captured graphs): when set, the soft input is ignored,
        exactly as soft = None."""
        with label("sc_inject", tok_emb, soft):
            h = tok_emb if soft is None else tok_emb + self.forward(self.pre_norm(soft))
            if first is not None:
                h = torch.where(first, tok_emb, h)
            return ops.gemma_rms_norm(h, None, self.eps)  # Gemma's roundings (fp32, one cast)


def soft_embedding(
    logits: torch.Tensor, embed: torch.Tensor, temperature: float, log_z: torch.Tensor | None = None
) -> torch.Tensor:
    """z = softmax(logits / T) @ E for every row: [rows, vocab] x [vocab, hidden] -> [rows, hidden].

    `log_z` (logsumexp of logits / T, fp32) is the decoder's log-normaliser; passing it skips a
    second reduction over the vocabulary. Under tensor parallelism (`dlmrt/parallel/vocab.py`)
    each rank's shard gives a partial sum, and one all-reduce the whole z.
    """
    group = tp.active()  # sharded: logits and E are this rank's vocabulary shard
    with label("orl_z", logits, embed):
        if log_z is None:
            y = logits.float() / temperature
            log_z = torch.logsumexp(y, dim=-1) if group is None else vocab.logsumexp(y, group)
        return vocab.reduce_sum(
            ops.softmax_probs(logits, log_z, temperature, embed.dtype) @ embed, group
        )


@torch.no_grad()
def rescale_residual_adapter(adapter: ResidualAdapter, gamma: float) -> ResidualConfig:
    """Multiply W_g, W_u, W_d by gamma and divide both scales by gamma (the paper's make_scrp_base).

    The adapter computes the same function (up to rounding): SiLU sees (gamma W_g)(u / gamma) = W_g u,
    and the output is (gamma W_d)(...) / gamma. Returns the updated config (to save with the weights).
    """
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    for proj in (adapter.gate_proj, adapter.up_proj, adapter.down_proj):
        proj.weight.mul_(gamma)
    adapter.input_scale /= gamma
    adapter.output_scale /= gamma
    adapter.cfg = replace(
        adapter.cfg, input_scale=adapter.input_scale, output_scale=adapter.output_scale
    )
    return adapter.cfg
