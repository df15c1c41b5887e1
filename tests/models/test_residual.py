"""The ORL residual pathway: g(0) = 0, rescaling preserves the function, exact injection semantics."""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint

from dlmrt.attention import AttnContext
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.models.residual import (
    ResidualAdapter,
    ResidualConfig,
    rescale_residual_adapter,
    soft_embedding,
)

CPU = torch.device("cpu")


def _adapter(seed: int = 0, **kw) -> ResidualAdapter:
    torch.manual_seed(seed)
    adapter = ResidualAdapter(32, ResidualConfig(intermediate_size=40, **kw))
    with torch.no_grad():
        adapter.norm.weight.uniform_(0.5, 1.5)
    return adapter


def _manual_g(adapter: ResidualAdapter, z: torch.Tensor) -> torch.Tensor:
    """g(z) written out from the weights: s_out * W_d[SiLU(W_g u) * W_u u], u = s_in * RMSNorm_w(z)."""
    c = adapter.cfg
    u = (
        z
        / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + c.norm_eps)
        * adapter.norm.weight
        * c.input_scale
    )
    inner = torch.nn.functional.silu(u @ adapter.gate_proj.weight.T) * (
        u @ adapter.up_proj.weight.T
    )
    return c.output_scale * inner @ adapter.down_proj.weight.T


def test_adapter_maps_zero_to_zero():
    """z = 0 (a block's first round) gives g(z) = 0 exactly."""
    adapter = _adapter(input_scale=0.125, output_scale=0.125)
    assert torch.equal(adapter(torch.zeros(5, 32)), torch.zeros(5, 32))


def test_adapter_matches_written_out_formula():
    """The module computes Equation 1's g(z) with both scales."""
    adapter = _adapter(input_scale=0.5, output_scale=2.0)
    z = torch.randn(7, 32)
    torch.testing.assert_close(adapter(z), _manual_g(adapter, z), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gamma", [8.0, 0.25])
def test_rescale_preserves_adapter_function(gamma):
    """rescale_residual_adapter(gamma) multiplies W by gamma, divides the scales, keeps g(z)."""
    adapter = _adapter(seed=1)
    z = torch.randn(9, 32)
    before, w_gate = adapter(z), adapter.gate_proj.weight.clone()
    cfg = rescale_residual_adapter(adapter, gamma)
    assert cfg.input_scale == pytest.approx(1 / gamma) and cfg.output_scale == pytest.approx(
        1 / gamma
    )
    torch.testing.assert_close(adapter.gate_proj.weight, gamma * w_gate)
    after = adapter(z)
    assert ((after - before).abs().max() / before.abs().max()).item() <= 1e-5


def test_rescale_preserves_model_logits(tmp_path):
    """A whole ORL model's denoising logits are unchanged (<= 1e-5 relative) by gamma = 8."""
    model = load_checkpoint(
        write_checkpoint(tmp_path / "m", residual=residual_config()), torch.float32, CPU
    ).model
    ids = torch.randint(0, 259, (16,), generator=torch.Generator().manual_seed(0))
    z = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    receives = torch.tensor([True, False] * 4)
    ctx = AttnContext(torch.arange(16), block_size=8)
    before = model(ids, ctx, z=z, receives=receives)
    rescale_residual_adapter(model.adapter, 8.0)
    after = model(ids, ctx, z=z, receives=receives)
    assert ((after - before).abs().max() / before.abs().max()).item() <= 1e-5


def test_rescale_rejects_non_positive_gamma():
    with pytest.raises(ValueError, match="gamma"):
        rescale_residual_adapter(_adapter(), 0.0)


@pytest.mark.parametrize("post", [0.02, None])
def test_inject_rows_and_post_norm(post):
    """h = post(E[x] + alpha*m*g(z)); rows with m = 0 get post(E[x]); post = s * RMSNorm or identity."""
    adapter = _adapter(seed=2, strength=0.7, post_norm_scale=post)
    emb, z = torch.randn(6, 32), torch.randn(6, 32)
    receives = torch.tensor([True, False, True, True, False, False])
    h = adapter.inject(emb, z, receives)
    raw = emb + 0.7 * receives[:, None].float() * _manual_g(adapter, z)
    if post is not None:
        raw = post * raw / torch.sqrt(raw.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(h, raw, rtol=1e-5, atol=1e-6)


def test_residual_applies_to_the_block_rows_only(tmp_path):
    """Clean context rows before the block see no residual and no post-norm (oracle layout)."""
    model = load_checkpoint(
        write_checkpoint(tmp_path / "m", residual=residual_config()), torch.float32, CPU
    ).model
    ids = torch.randint(0, 259, (16,), generator=torch.Generator().manual_seed(3))
    ctx = AttnContext(torch.arange(16), block_size=8)
    clean = model(ids, ctx)
    noisy = model(ids, ctx, z=torch.randn(8, 64), receives=torch.ones(8, dtype=torch.bool))
    assert torch.equal(clean[:8], noisy[:8])  # block 0 is context; block 1 cannot reach it
    assert not torch.allclose(clean[8:], noisy[8:])


def test_masked_positions_ignore_resolved_rows_residual(tmp_path):
    """Only rows with m = 1 read their z: changing z on an m = 0 row changes nothing."""
    model = load_checkpoint(
        write_checkpoint(tmp_path / "m", residual=residual_config()), torch.float32, CPU
    ).model
    ids = torch.randint(0, 259, (8,), generator=torch.Generator().manual_seed(4))
    ctx = AttnContext(torch.arange(8), block_size=8)
    z = torch.randn(8, 64, generator=torch.Generator().manual_seed(5))
    receives = torch.tensor([True, True, False, True, False, True, True, True])
    z2 = z.clone()
    z2[2] += 1.0
    assert torch.equal(
        model(ids, ctx, z=z, receives=receives), model(ids, ctx, z=z2, receives=receives)
    )
    z2[3] += 1.0
    assert not torch.equal(
        model(ids, ctx, z=z, receives=receives), model(ids, ctx, z=z2, receives=receives)
    )


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_soft_embedding_is_expected_embedding(temperature):
    """z = softmax(logits / T) @ E; passing the decoder's log-normaliser gives the same z."""
    logits, table = torch.randn(4, 11), torch.randn(11, 6)
    expected = torch.softmax(logits / temperature, -1) @ table
    torch.testing.assert_close(soft_embedding(logits, table, temperature), expected)
    log_z = torch.logsumexp(logits / temperature, -1)
    torch.testing.assert_close(soft_embedding(logits, table, temperature, log_z), expected)


def test_base_model_has_no_adapter(tmp_path):
    """A checkpoint without orl_residual is a Base model: z is ignored."""
    model = load_checkpoint(write_checkpoint(tmp_path / "m"), torch.float32, CPU).model
    ids = torch.randint(0, 259, (8,))
    ctx = AttnContext(torch.arange(8), block_size=8)
    assert model.adapter is None
    assert torch.equal(
        model(ids, ctx),
        model(ids, ctx, z=torch.randn(8, 64), receives=torch.ones(8, dtype=torch.bool)),
    )


@pytest.mark.parametrize("positions", ["masked", "block"])
def test_round_receives_rows_by_positions(tmp_path, positions):
    """'masked': rows unresolved at the start of the round get g(z); 'block': every row."""
    from dlmrt.decoding import make_rule
    from dlmrt.engine.block.round import RoundSpec

    path = write_checkpoint(tmp_path / "m", residual=residual_config(positions))
    spec = RoundSpec(
        load_checkpoint(path, torch.float32, CPU).model, make_rule("threshold"), 0.0, 8
    )
    unresolved = torch.tensor([False, True, True, False, True, True, True, True])
    expected = unresolved if positions == "masked" else torch.ones(8, dtype=torch.bool)
    assert torch.equal(spec.receives(unresolved), expected)
