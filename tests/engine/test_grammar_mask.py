"""engine/grammar_mask.py: packed allowed-sets unpacked on the device equal the host's unpacking;
masked rows are -inf exactly off their sets, other rows untouched; the chain's token pick."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlmrt.engine.grammar_mask import best_allowed, mask_rows, unpack
from dlmrt.structured.closing import Mask


def _mask(vocab: int, seed: int, density: float = 0.3) -> Mask:
    ok = np.random.default_rng(seed).random(vocab) < density
    words = np.packbits(np.pad(ok, (0, -vocab % 32)), bitorder="little").view(np.uint32)
    return Mask(words.copy(), vocab)


@pytest.mark.parametrize("vocab", [31, 64, 1000, 151936])
def test_unpacking_on_the_device_matches_the_host(vocab):
    masks = [_mask(vocab, s) for s in range(3)]
    words = torch.from_numpy(np.stack([m.words for m in masks]).view(np.int32))
    got = unpack(words, vocab)
    assert got.shape == (3, vocab)
    for row, m in zip(got, masks, strict=True):
        assert torch.equal(row, torch.from_numpy(m.unpack()))


def test_masked_rows_are_minus_inf_off_their_sets_and_others_untouched():
    vocab, rows = 300, 6
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    masks = [_mask(vocab, 1), _mask(vocab, 2)]
    out = mask_rows(logits, [1, 4], masks)
    twin = logits.clone()  # the plain twin: each row's host-unpacked set
    for r, m in zip([1, 4], masks, strict=True):
        twin[r][~torch.from_numpy(m.unpack())] = float("-inf")
    assert torch.equal(out, twin) and not torch.equal(out, logits)
    assert mask_rows(logits, [], []) is logits


def test_the_chain_picks_the_best_allowed_else_the_only_allowed():
    vocab = 64
    m = Mask.single(40, vocab)
    assert m.count() == 1 and m.unpack().nonzero()[0].tolist() == [40]
    assert best_allowed([3, 40, 7], m) == 40
    assert best_allowed([3, 7], m) == 40  # forced: outside the model's top candidates
    two = _mask(vocab, 5, 0.0)
    two.words[0] = np.uint32((1 << 2) | (1 << 9))
    assert best_allowed([9, 2], two) == 9 and best_allowed([1, 3], two) is None
