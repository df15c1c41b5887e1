"""The staircase mask of packed replay rows == a rule-by-rule dense reference."""

from __future__ import annotations

import pytest
import torch
from orl_helpers import crafted_rollout

from dlmrt.train.masks import dense_mask
from dlmrt.train.orl.plan import Doc, Target
from dlmrt.train.orl.row import build_row

L = 4


def _docs():
    """Three documents: prompt 6 (not a block multiple) and 8 (a multiple), states at different
    rounds, one document with a single noisy block, one with three."""
    a = crafted_rollout(6, 9, L, [3, 2, 2])  # blocks 1, 2, 3
    b = crafted_rollout(8, 5, L, [2, 3])  # blocks 2, 3
    return [
        Doc(a, [a.blocks[1][0], a.blocks[2][1], a.blocks[3][1]], 1.0, [Target()] * 3),
        Doc(b, [b.blocks[3][2]], 1.0, [Target()]),
        Doc(a, [a.blocks[1][2], a.blocks[2][0]], 1.0, [Target()] * 2),
    ]


def reference(docs, pad_to):
    """Visibility written out rule by rule from the documents' layout (not from the metadata)."""
    regions = []  # (doc, kind, start, stop, block or None)
    at = 0
    for d, doc in enumerate(docs):
        regions.append((d, "clean", at, at + doc.clean_len, None))
        at += doc.clean_len
        for s in doc.states:
            regions.append((d, "noisy", at, at + L, s.block))
            at += L
    n = at + (-at % pad_to)
    where = {}
    for reg in regions:
        for i in range(reg[2], reg[3]):
            where[i] = reg
    m = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        if q not in where:  # a pad row sees itself only
            m[q, q] = True
            continue
        dq, kind, start, stop, blk = where[q]
        for k in range(n):
            if k not in where or where[k][0] != dq:
                continue  # pads and other documents: never
            dk, kkind, kstart, _, _ = where[k]
            if kind == "clean":  # block-causal over the clean rows (prompt + response)
                m[q, k] = kkind == "clean" and (k - kstart) // L <= (q - start) // L
            elif kkind == "clean":  # noisy: the prompt and the clean blocks before its own
                m[q, k] = (k - kstart) // L < blk
            else:  # noisy: its own copy only
                m[q, k] = where[k] is where[q]
    return m


@pytest.mark.parametrize("pad_to", [1, 16])
def test_staircase_equals_rule_by_rule_reference(pad_to):
    docs = _docs()
    row = build_row(docs, 512, torch.device("cpu"), pad_to=pad_to)
    got = dense_mask(row.meta)
    assert torch.equal(got, reference(docs, pad_to))
    # the noisy rows reuse the clean positions: block b's copy sits at b*L .. b*L + L - 1
    assert row.positions[row.noisy].view(-1, L)[:, 0].tolist() == [4, 8, 12, 12, 4, 8]


def test_noisy_rows_carry_the_captured_state():
    docs = _docs()
    row = build_row(docs, 512, torch.device("cpu"))
    s = docs[0].states[1]
    assert torch.equal(row.ids[row.noisy[L : 2 * L]], s.canvas)
    assert torch.equal(row.z[L : 2 * L], s.z) and torch.equal(
        row.unresolved[L : 2 * L], s.unresolved
    )
    # targets: the response's tokens where valid (response rows up to the last token), else 0
    full = docs[0].rollout.full_ids
    assert row.target[:L].tolist() == [0, 0] + full[6:8]  # block 1 holds the prompt tail 4, 5
    assert row.token_weight[:L].tolist() == [0.0, 0.0, 1.0, 1.0]
    last = docs[1].rollout  # prompt 8 + 5 tokens: block 3 has position 12 only
    assert row.target[3 * L : 4 * L].tolist() == [last.full_ids[12], 0, 0, 0]


def test_flex_rows_are_padded_to_power_of_two_tiles():
    from dlmrt.train.orl.row import flex_length

    assert [flex_length(n, 128) for n in (1, 128, 129, 300, 513, 4096)] == [
        128,
        128,
        256,
        512,
        1024,
        4096,
    ]
    docs = _docs()
    row = build_row(docs, 512, torch.device("cpu"), length=64)
    assert row.num_tokens == 64 and torch.equal(dense_mask(row.meta), reference(docs, 64))
    with pytest.raises(ValueError, match="do not fit in length 8"):
        build_row(docs, 512, torch.device("cpu"), length=8)
