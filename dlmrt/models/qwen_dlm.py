"""QwenDLM: a Qwen3 dense backbone run as a block-diffusion model (SDAR), with the optional ORL adapter.

Parameter names follow the HF checkpoint (`model.layers.N.self_attn.q_proj.weight`, ...,
`model.residual_adapter.*`), so loading is a name-for-name copy. A checkpoint without
`orl_residual` in its config is a Base model (no adapter).
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.attention import AttnContext
from dlmrt.models.config import ModelConfig
from dlmrt.models.layers import DecoderLayer, RMSNorm, rope_cos_sin
from dlmrt.models.residual import ResidualAdapter


class QwenDLMBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.residual_adapter = (
            ResidualAdapter(cfg.hidden_size, cfg.residual) if cfg.residual is not None else None
        )


class QwenDLM(nn.Module):
    """forward(ids, ctx, z, receives) -> logits [rows, vocab] (or None for a KV-only commit pass).

    Without `z` every row is clean context (prefill, commit passes). With `z`, the last z.shape[0]
    rows are the block being denoised and get h = post(E[x] + alpha * m * g(z)).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = QwenDLMBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def fuse_projections(self) -> None:
        """One GEMM for q/k/v and one for gate/up in every layer (and the adapter). After loading."""
        for module in self.modules():
            if hasattr(module, "fuse") and module is not self:
                module.fuse()

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def embed_table(self) -> torch.Tensor:
        """E: the input embedding table [vocab, hidden], used for the pre-adapter residual z = p^T E."""
        return self.model.embed_tokens.weight

    @property
    def adapter(self) -> ResidualAdapter | None:
        return self.model.residual_adapter

    def forward(
        self,
        input_ids: torch.Tensor,  # [rows]
        ctx: AttnContext,
        z: torch.Tensor | None = None,  # [n, hidden] pre-adapter residual of the last n rows
        receives: torch.Tensor | None = None,  # [n] bool: which of those rows get alpha * g(z)
        compute_logits: bool = True,
        last_logits: int | None = None,  # n: logits of the last n rows only
    ) -> torch.Tensor | None:
        h = self.model.embed_tokens(input_ids)
        if z is not None and self.adapter is not None:
            h = self.adapter.inject_tail(h, z, receives)
        rope = rope_cos_sin(ctx.positions, self.cfg.head_dim, self.cfg.rope_theta, h.dtype)
        residual = None
        for layer in self.model.layers:
            h, residual = layer(h, residual, rope, ctx)
        if not compute_logits:
            return None
        if last_logits is not None:
            h, residual = h[-last_logits:], residual[-last_logits:]
        return self.lm_head(self.model.norm(h, residual)[0])
