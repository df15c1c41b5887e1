"""The replay check of a request's drafts (tests/test_drafts.py, tests/engine/test_drafts_gpu.py)."""

from __future__ import annotations

from dlmrt.drafts import FINAL, MASKED, Draft


def assert_replays(drafts: list[Draft], out, canvas: bool = False) -> None:
    """Rounds 1..n per block (n = the block's rounds), a block's prefix = the previous block's
    output, decided rows stay decided and keep their token unless re-accepted (block style), and
    the last draft is the output."""
    blocks: dict[int, list[Draft]] = {}
    for d in drafts:
        blocks.setdefault(d.block, []).append(d)
    assert list(blocks) == list(range(len(out.rounds_per_block)))
    prefix: list[int] = []
    for b, rounds in blocks.items():
        assert [d.round for d in rounds] == list(range(1, out.rounds_per_block[b] + 1))
        assert list(rounds[0].prefix) == prefix
        assert [d.final for d in rounds] == [False] * (len(rounds) - 1) + [True]
        for prev, d in zip(rounds, rounds[1:]):
            assert list(d.prefix) == prefix
            assert len(d.tokens) == len(d.states) == len(d.confidence)
            if canvas:
                continue  # a canvas step's acceptance is its own: rejected rows are re-noised
            kept = {i for i in prev.accepted_rows if i < len(d.states)}  # the last: maybe cut
            assert set(d.accepted_rows) >= kept, (b, d.round)
            for i, s in enumerate(d.states):
                if s == FINAL:  # resolved earlier and untouched since: the same token
                    assert prev.states[i] != MASKED and d.tokens[i] == prev.tokens[i]
        assert MASKED not in rounds[-1].states
        prefix = rounds[-1].ids
    assert drafts[-1].ids == out.token_ids
    assert all(0.0 <= c <= 1.0 for d in drafts for c in d.confidence)
