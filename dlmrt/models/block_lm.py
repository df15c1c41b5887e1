"""BlockLM: the forward QwenDLM and LLaDA2 share (embed -> ORL adapter -> layers -> norm -> head).

Subclasses give their decoder layer class (called as layer(cfg, index); it takes (h, residual,
rope, ctx)), the checkpoint's name of the embedding (`EMBED`), and how many leading dims of a head
RoPE rotates (`rotary_dim`). Parameter names follow the HF checkpoints (`model.<EMBED>.weight`,
`model.layers.N...`, `model.norm.weight`, `model.residual_adapter.*`, `lm_head.weight`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dlmrt.account import label
from dlmrt.attention import AttnContext
from dlmrt.models.layers import RMSNorm, rope_cos_sin
from dlmrt.models.residual import ResidualAdapter


class Backbone(nn.Module):
    """Embedding (named `embed`), decoder layers, final add-RMSNorm, optional ORL adapter."""

    def __init__(self, cfg, embed: str, layer: Callable[..., nn.Module]) -> None:
        super().__init__()
        setattr(self, embed, nn.Embedding(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.residual_adapter = (
            ResidualAdapter(cfg.hidden_size, cfg.residual) if cfg.residual is not None else None
        )


class BlockLM(nn.Module):
    """forward(ids, ctx, z, receives) -> logits [rows, vocab] (None for a KV-only pass).

    Without `z` every row is clean context (prefill, commit passes). With `z`, the last z.shape[0]
    rows are the block being denoised and get h = post(E[x] + alpha * m * g(z)).
    """

    EMBED = "embed_tokens"

    def __init__(self, cfg, layer: Callable[..., nn.Module]) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg, self.EMBED, layer)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def rotary_dim(self) -> int:
        return self.cfg.head_dim

    def fuse_projections(self) -> None:
        """One GEMM for q/k/v and for gate/up wherever a module can fuse. After loading."""
        for module in self.modules():
            if hasattr(module, "fuse") and module is not self:
                module.fuse()

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.embed_table

    def use_quantized(self, weights: dict, **how: bool | str) -> list[str]:
        """Run these FP8 / NVFP4 weights ({parameter name: weight}); returns the names not
        installed (the loader dequantizes them); `how`: the install's options (emulate,
        prefer). The sites are the block layers' (`dlmrt/impls/install.py`), measured at the
        block's rows."""
        from dlmrt.impls.install import block_layers, install_quantized  # loads on demand

        return install_quantized(self, weights, self.cfg.block_size, block_layers, **how)

    @property
    def embed_table(self) -> torch.Tensor:
        """E: the input embedding table [vocab, hidden], used for the pre-adapter residual z = p^T E."""
        return getattr(self.model, self.EMBED).weight

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
        normed: bool = False,  # return the head's input (final normed hidden), not the logits
    ) -> torch.Tensor | None:
        """`normed`: the final normed hidden [rows, hidden] of the rows the logits would cover,
        for the round's one pass over the vocabulary to apply the head (`ops.vocab_pass`)."""
        h = getattr(self.model, self.EMBED)(input_ids)
        if z is not None and self.adapter is not None:
            h = self.adapter.inject_tail(h, z, receives)
        with label("rope_tables", ctx.positions):
            rope = rope_cos_sin(ctx.positions, self.rotary_dim, self.cfg.rope_theta, h.dtype)
        residual = None
        for layer in self.model.layers:
            h, residual = layer(h, residual, rope, ctx)
        if not compute_logits:
            return None
        if last_logits is not None:
            h, residual = h[-last_logits:], residual[-last_logits:]
        h = self.model.norm(h, residual)[0]
        return h if normed else self.lm_head(h)
