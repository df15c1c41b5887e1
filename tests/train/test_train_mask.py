"""The block-diffusion training layout and mask: rule by rule, and equal to what inference computes."""

from __future__ import annotations

import warnings

import pytest
import torch

from dlmrt.attention import AttnContext
from dlmrt.blocks import initial_canvas, layout
from dlmrt.models.config import model_config_from_hf
from dlmrt.train.config import TrainConfig
from dlmrt.train.data import IGNORE, Example, pack
from dlmrt.train.masks import block_mask, dense_mask
from dlmrt.train.model import build_model
from dlmrt.train.noise import mask_blocks

B = 4
MASK, PAD = 3, 0
LENGTH = 80


def _examples() -> list[Example]:
    ids = iter(range(10, 200))
    # (prompt, response) lengths: a prompt tail of 3 in block 2 and 6 decode blocks; a prompt of
    # whole blocks; a prompt shorter than one block (its first decode block is block 0).
    shapes = [(11, 21), (8, 4), (2, 6)]
    return [
        Example([next(ids) for _ in range(p)], [next(ids) for _ in range(r)]) for p, r in shapes
    ]


def _reference_mask(examples: list[Example], length: int) -> torch.Tensor:
    """The visibility rules, one by one, from the layout description (not from the metadata)."""
    m = torch.zeros(length, length, dtype=torch.bool)
    row = 0
    for ex in examples:
        p, total = len(ex.prompt), len(ex.prompt) + len(ex.response)
        k, first = total // B, len(ex.prompt) // B
        clean = [(row + i, i) for i in range((k - 1) * B)]  # (row, position)
        row += len(clean)
        noisy = [(row + i, first * B + i) for i in range((k - first) * B)]
        row += len(noisy)
        for q, qp in clean:
            for kv, kp in clean:  # clean (prompt or response) rows: block-causal
                m[q, kv] = kp // B <= qp // B
        for q, qp in noisy:
            for kv, kp in clean:  # the prompt and the clean blocks strictly before
                m[q, kv] = kp // B < qp // B
            for kv, kp in noisy:  # its own noisy block, bidirectionally; no other noisy block
                m[q, kv] = kp // B == qp // B
        assert p > 0
    for r in range(row, length):  # pads: themselves only
        m[r, r] = True
    return m


def _batch(seed: int = 0):
    return pack(_examples(), B, LENGTH, MASK, PAD, torch.Generator().manual_seed(seed))


def test_dense_mask_equals_rule_by_rule_mask():
    batch = _batch()
    assert batch.num_examples == 3
    assert torch.equal(dense_mask(batch.meta), _reference_mask(_examples(), LENGTH))


def test_block_mask_matches_dense_mask():
    from torch.nn.attention.flex_attention import create_mask

    from dlmrt.train.masks import make_mask_mod

    batch = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dense = create_mask(make_mask_mod(batch.meta), None, None, LENGTH, LENGTH, device="cpu")
        bm = block_mask(batch.meta)
    assert torch.equal(dense[0, 0], dense_mask(batch.meta))
    assert bm.shape[-2:] == (LENGTH, LENGTH)


def test_layout_positions_noise_and_labels():
    batch = _batch()
    exs = _examples()
    row = 0
    for ex in exs:
        x = ex.prompt + ex.response
        p, k = len(ex.prompt), len(x) // B
        first = p // B
        clean_rows = range(row, row + (k - 1) * B)
        noisy_rows = range(clean_rows.stop, clean_rows.stop + (k - first) * B)
        row = noisy_rows.stop
        assert batch.input_ids[clean_rows.start : clean_rows.stop].tolist() == x[: (k - 1) * B]
        pos = batch.positions[noisy_rows.start : noisy_rows.stop]
        assert pos.tolist() == list(range(first * B, k * B))  # noisy copy = clean positions
        noisy_ids = batch.input_ids[noisy_rows.start : noisy_rows.stop]
        labels = batch.labels[noisy_rows.start : noisy_rows.stop]
        tail = p - first * B
        assert noisy_ids[:tail].tolist() == ex.prompt[first * B :]  # prompt tail: never masked
        masked = noisy_ids == MASK
        assert not masked[:tail].any()
        assert torch.equal(labels != IGNORE, masked)
        assert labels[masked].tolist() == [x[i] for i in pos[masked].tolist()]
        assert noisy_ids[~masked].tolist() == [x[i] for i in pos[~masked].tolist()]
        for b in range(k - first):  # every noisy block has at least one masked token
            assert masked[b * B : (b + 1) * B].any()
    assert batch.num_masked == int((batch.labels != IGNORE).sum())
    assert torch.equal(batch.loss_rows, (batch.labels != IGNORE).nonzero().squeeze(1))
    assert batch.input_ids[row:].eq(PAD).all() and batch.labels[row:].eq(IGNORE).all()
    # The noise is a function of the generator's seed.
    assert torch.equal(_batch(5).input_ids, _batch(5).input_ids)
    assert not torch.equal(_batch(5).input_ids, _batch(6).input_ids)


def test_mask_count_is_uniform_per_block():
    gen = torch.Generator().manual_seed(0)
    group = torch.arange(4000).repeat_interleave(4)  # 4000 blocks of 4 candidates
    masked, ratio = mask_blocks(group, 4000, gen)
    counts = masked.view(4000, 4).sum(1)
    freq = torch.bincount(counts, minlength=5)[1:].float() / 4000
    assert counts.min() >= 1 and torch.allclose(freq, torch.full((4,), 0.25), atol=0.03)
    assert torch.allclose(ratio.view(4000, 4)[:, 0], counts / 4.0)
    first_masked = masked.view(4000, 4).float().mean(0)  # positions are uniform too
    assert torch.allclose(first_masked, first_masked.mean().expand(4), atol=0.03)


def _tiny_model():
    cfg = TrainConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        block_size=B,
    )
    hf = cfg.hf_config(256, {"<|endoftext|>": 0, "<|MASK|>": 3})
    model = build_model(model_config_from_hf(hf, "test/config.json"), torch.device("cpu"), 0)
    return model.eval()


@torch.no_grad()
def test_training_forward_equals_inference_view():
    """Each noisy block's logits in the packed forward equal the inference oracle's for its canvas:
    the prefix (prompt blocks + clean blocks before it) under the block-causal rule, then the block
    laid out by the engine's own `initial_canvas` (prompt tail first)."""
    model = _tiny_model()
    batch = _batch()
    logits = model(batch.input_ids, AttnContext(batch.positions, B, mask=dense_mask(batch.meta)))
    row = 0
    for ex in _examples():
        x = ex.prompt + ex.response
        p, k = len(ex.prompt), len(x) // B
        first = p // B
        noisy_start = row + (k - 1) * B
        lay = layout(p, len(ex.response), B)
        for b in range(first, k):
            rows = slice(noisy_start + (b - first) * B, noisy_start + (b - first + 1) * B)
            canvas, unresolved = initial_canvas(lay, b, ex.prompt, MASK, torch.device("cpu"))
            noisy = batch.input_ids[rows]
            assert torch.equal(canvas[~unresolved], noisy[~unresolved])  # the prompt tail
            ids = torch.cat((torch.tensor(x[: b * B], dtype=torch.long), noisy))
            ref = model(ids, AttnContext(torch.arange((b + 1) * B), B))[-B:]
            torch.testing.assert_close(logits[rows], ref, atol=1e-5, rtol=1e-5)
        row = noisy_start + (k - first) * B


@torch.no_grad()
def test_flex_attention_path_equals_dense_on_cpu():
    """The BlockMask route in `block_attention` (flex_attention, eager on CPU) gives the dense result."""
    model = _tiny_model()
    batch = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            bm = block_mask(batch.meta)
            flex = model(batch.input_ids, AttnContext(batch.positions, B, mask=bm))
        except Exception as e:  # pragma: no cover - depends on the torch build
            pytest.skip(f"flex_attention unavailable on this CPU build: {e}")
    dense = model(batch.input_ids, AttnContext(batch.positions, B, mask=dense_mask(batch.meta)))
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
