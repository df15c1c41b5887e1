"""QwenDLM: a Qwen3 dense backbone run as a block-diffusion model (SDAR), with the optional ORL adapter.

Parameter names follow the HF checkpoint (`model.layers.N.self_attn.q_proj.weight`, ...,
`model.residual_adapter.*`), so loading is a name-for-name copy. A checkpoint without
`orl_residual` in its config is a Base model (no adapter).
"""

from __future__ import annotations

from dlmrt.models.block_lm import BlockLM
from dlmrt.models.config import ModelConfig
from dlmrt.models.layers import DecoderLayer


class QwenDLM(BlockLM):
    """Qwen3 layers under the shared block-diffusion forward (`BlockLM`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, DecoderLayer)
