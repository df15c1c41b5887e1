"""QwenDLM: a Qwen3 dense backbone run as a block-diffusion model (SDAR), with the optional ORL adapter.

Parameter names follow the HF checkpoint (`model.layers.N.self_attn.q_proj.weight`, ...,
`model.residual_adapter.*`), so loading is a name-for-name copy. A checkpoint without
`orl_residual` in its config is a Base model (no adapter).
"""

from __future__ import annotations

from torch import nn

from dlmrt.models.block_lm import BlockLM
from dlmrt.models.config import ModelConfig
from dlmrt.models.layers import DecoderLayer, RMSNorm
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


class QwenDLM(BlockLM):
    """Qwen3 layers under the shared block-diffusion forward (`BlockLM`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, QwenDLMBackbone(cfg))
