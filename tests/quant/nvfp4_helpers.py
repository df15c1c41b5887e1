"""Tiny checkpoints of the three families whose expert widths are multiples of 16 (NVFP4 blocks)."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint


def dg_checkpoint(out: Path) -> Path:
    """The tests' tiny DiffusionGemma (tests/dg_helpers.py) with 16-wide experts."""
    from dg_helpers import _config, _randomise, dg, save_checkpoint

    torch.manual_seed(0)
    hf = dg.DiffusionGemmaForBlockDiffusion(_config(moe_intermediate_size=16)).eval()
    _randomise(hf, 1)
    return save_checkpoint(hf, out)


def nvfp4_sources(root: Path) -> dict[str, Path]:
    return {
        "qwen": write_checkpoint(root / "qwen", residual=residual_config()),
        "llada2": write_llada2_checkpoint(root / "llada2", moe_intermediate_size=32),
        "dg": dg_checkpoint(root / "dg"),
    }
