"""Backbone parity with transformers' Qwen3ForCausalLM (the oracle no one here wrote)."""

from __future__ import annotations

import pytest
import torch
from conftest import write_checkpoint

from dlmrt.attention import AttnContext
from dlmrt.loading.checkpoint import load_checkpoint

CPU = torch.device("cpu")


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "SDARForCausalLM"])
def test_causal_logits_match_transformers(tmp_path, tie, arch):
    """Under a causal mask (block size 1) dlmrt's logits equal transformers' to 1e-5 relative."""
    from transformers import Qwen3ForCausalLM

    path = write_checkpoint(tmp_path / "m", architecture=arch, tie_word_embeddings=tie, seed=3)
    hf = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = load_checkpoint(path, torch.float32, CPU).model
    ids = torch.randint(0, 260, (37,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        out = ours(ids, AttnContext(torch.arange(37), block_size=1))
    assert _rel_err(out, ref) <= 1e-5


def test_rope_theta_and_positions_follow_config(tmp_path):
    """A large rope theta and shifted positions still match transformers (position_ids honoured)."""
    from transformers import Qwen3ForCausalLM

    path = write_checkpoint(tmp_path / "m", rope_theta=5_000_000.0, seed=4)
    hf = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = load_checkpoint(path, torch.float32, CPU).model
    assert ours.cfg.rope_theta == 5_000_000.0
    ids = torch.randint(0, 260, (20,), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(100, 120)
    with torch.no_grad():
        ref = hf(ids[None], position_ids=pos[None]).logits[0]
        out = ours(ids, AttnContext(pos, block_size=1))
    assert _rel_err(out, ref) <= 1e-5


def test_block_attention_is_bidirectional_within_a_block(tmp_path):
    """With block size 8, a row's logits depend on later rows of its own block but not of the next."""
    ours = load_checkpoint(write_checkpoint(tmp_path / "m"), torch.float32, CPU).model
    ids = torch.randint(0, 259, (24,), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[13] = (ids[13] + 1) % 259  # a row of block 1
    ctx = AttnContext(torch.arange(24), block_size=8)
    with torch.no_grad():
        a, b = ours(ids, ctx), ours(changed, ctx)
    assert torch.equal(a[:8], b[:8])  # block 0 cannot see block 1
    assert not torch.allclose(a[8:13], b[8:13])  # earlier rows of block 1 see row 13
    assert not torch.allclose(a[16:], b[16:])  # block 2 sees block 1
