"""The grammar state on its own (llguidance over the demo tokenizer): the walk's building blocks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llguidance")

from dlmrt.demo import demo_model_path  # noqa: E402
from dlmrt.engine.block.structured import (  # noqa: E402
    _Block,
    check_edits_consumed,
    masked,
    settle,
)
from dlmrt.structured import parse  # noqa: E402
from dlmrt.structured.grammar import grammars_for  # noqa: E402
from dlmrt.tokenizer import Tokenizer  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
FMT = parse({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
MASK, STOP = 3, 0


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(demo_model_path())


@pytest.fixture
def grammars(tok):
    return grammars_for(tok, 512, {0, 2})


def test_closing_and_forced(tok, grammars):
    c = grammars.constraint(FMT, 32)
    assert tok.decode(c.closing) == '{"answer":0}'
    assert tok.decode(c.forced()) == '{"answer":'


def test_escapes_are_valid_string_content(tok, grammars):
    fmt = parse({"type": "json_schema", "json_schema": {"schema": {"type": "string"}}})
    c = grammars.constraint(fmt, 64)
    good = tok.encode('"a\\"b\\\\c\\n"')
    assert c.take(good) == len(good)
    assert c.m.is_accepting()
    bad = grammars.constraint(fmt, 64)
    raw = tok.encode('"a\nb"')  # a raw newline inside a JSON string is invalid
    assert bad.take(raw) < len(raw)


def test_budget_forces_the_closing(tok, grammars):
    c = grammars.constraint(FMT, 12)
    c.take(c.forced())
    digits = tok.encode("1234567")
    n = c.take(digits)
    assert n < len(digits) and c.tight()  # a digit more and `}` would not fit
    assert c.take(c.forced()) >= 1 and c.m.is_accepting()
    assert len(c.history) <= 12


def test_replace_refuses_an_edit_that_breaks_the_grammar(tok, grammars):
    c = grammars.constraint(FMT, 32)
    ids = tok.encode('{"answer":12}')
    assert c.take(ids) == len(ids)
    assert c.replace(2, tok.encode("3}"))  # 13}: still valid
    assert tok.decode(c.history) == '{"answer":13}'
    assert not c.replace(2, tok.encode("a}"))  # breaks the number: refused, state kept
    assert tok.decode(c.history) == '{"answer":13}' and c.m.is_accepting()


def test_settle_keeps_drafts_and_masks_an_invalid_frontier(tok, grammars):
    c = grammars.constraint(FMT, 32)
    c.take(c.forced())  # `{"answer":` consumed before the block
    one, x, close = tok.encode("1")[0], tok.encode("x")[0], tok.encode("}")[0]
    # row 0 masked; row 1 a draft: it stays until the frontier reaches it
    st = _Block([MASK, close, MASK, MASK], [True, False, True, True], 0, 4, MASK, STOP)
    settle(st, c)
    assert st.frontier == 0 and st.canvas[1] == close and not st.unresolved[1]
    st.canvas[0], st.unresolved[0] = one, False  # the rule fills row 0: both rows are consumed
    settle(st, c)
    assert c.done or c.m.is_accepting()
    assert st.frontier == 4 and st.canvas[2:] == [STOP, STOP]  # done: stop rows, no forward
    # an invalid draft at the frontier goes back to mask
    c2 = grammars.constraint(FMT, 32)
    c2.take(c2.forced())
    st2 = _Block([x, one, MASK], [False, False, True], 0, 3, MASK, STOP)
    settle(st2, c2)
    assert st2.frontier == 0 and st2.unresolved[0] and st2.canvas[0] == MASK


def test_forced_tokens_replace_an_invalid_draft_at_the_frontier_in_the_same_settle(tok, grammars):
    """A draft the grammar rejects at the frontier goes back to mask, and what the grammar forces
    there (`{"answer":`) is committed at once: no forward is spent on a forced row."""
    c = grammars.constraint(FMT, 32)
    forced = c.forced()
    x = tok.encode("x")[0]
    st = _Block([x] + [MASK] * 11, [False] + [True] * 11, 0, 12, MASK, STOP)
    settle(st, c)
    assert st.frontier == len(forced) and st.canvas[: len(forced)] == forced
    assert st.forced == len(forced) and st.unresolved[len(forced)]


def test_an_edit_after_the_document_is_complete_rolls_back_only_what_the_grammar_took(
    tok, grammars
):
    """ "yes" in an 8-row block: the document is complete, the other 6 rows are stop tokens the
    grammar never consumed. Editing row 0 re-checks the 2 consumed rows only: "no" is accepted,
    "n" + "es" and a prefix that leaves the document open ("m" + "ay") are refused (the stop rows
    follow a complete document only), and an edit of a stop row is put back."""
    c = grammars.constraint(parse({"type": "choices", "choices": ["yes", "no", "maybe"]}), 8)
    yes, no, may = tok.encode("yes"), tok.encode("no"), tok.encode("maybe")[:2]
    assert len(yes) == len(no) == len(may) == 2  # the demo tokenizer's split
    st = _Block(yes + [MASK] * 6, [False] * 2 + [True] * 6, 0, 8, MASK, STOP)
    settle(st, c)
    assert c.done and st.frontier == 8 and st.canvas == yes + [STOP] * 6

    def edit(rows: dict[int, int]) -> None:
        old = list(st.canvas)
        for r, t in rows.items():
            st.canvas[r] = t
        check_edits_consumed(st, old, [r in rows for r in range(8)], c, 0)

    edit({0: no[0], 1: no[1]})
    assert st.canvas == no + [STOP] * 6 and c.history == no and c.done
    edit({0: no[0], 1: yes[1]})  # "n" + "es": not a choice
    assert st.canvas == no + [STOP] * 6 and c.history == no and c.done
    edit({0: may[0], 1: may[1]})  # a valid prefix, but the document would be open
    assert st.canvas == no + [STOP] * 6 and c.history == no and c.done
    edit({1: yes[1], 4: yes[0]})  # a consumed row and a stop row: both refused
    assert st.canvas == no + [STOP] * 6 and c.history == no and c.done
    assert tok.decode(c.history) == "no" and c.m.is_accepting() and not c.m.is_error()


def _logits(tok, rows: list[str]) -> torch.Tensor:
    """[len(rows), 512] logits whose row i ranks the characters of rows[i] first, in order."""
    lg = torch.zeros(len(rows), 512)
    for i, chars in enumerate(rows):
        for rank, ch in enumerate(chars):
            lg[i, tok.encode(ch)[0]] = 10.0 - rank
    return lg


def test_rows_right_of_the_frontier_are_masked_on_the_speculated_prefix(tok, grammars):
    """After `{"answer":` each row's best token is a space (the demo's own format), its second a
    digit or `}`: every row of the chain is masked to what the grammar allows after the rows
    left of it read as their best allowed tokens, so each masked argmax is valid in turn (`}`
    closes the object; the row after it may only stop). The grammar is left as it was."""
    c = grammars.constraint(FMT, 32)
    c.take(c.forced())
    st = _Block([MASK] * 4, [True] * 4, 0, 4, MASK, STOP)
    lg = masked(st, c, _logits(tok, [" 4", " 2", " }", " 7"]))
    assert tok.decode(lg.argmax(-1).tolist()[:3]) == "42}"
    assert lg[3].isfinite().nonzero().flatten().tolist() == [0, 2]  # the stop tokens
    assert len(c.history) == 7 and c.take(tok.encode("9}")) == 2  # the state as it was


def test_the_chain_reads_drafts_and_ends_at_one_the_grammar_rejects(tok, grammars, monkeypatch):
    """A draft stands for itself; a draft the grammar rejects ends the chain: the rows after it
    keep their logits (the walk checks them when the frontier reaches them)."""
    c = grammars.constraint(FMT, 32)
    c.take(c.forced())
    one, x = tok.encode("1")[0], tok.encode("x")[0]
    st = _Block([MASK, one, MASK, x, MASK], [True, False, True, False, True], 0, 5, MASK, STOP)
    raw = _logits(tok, [" 4", "1", " }", "x", " 5"])
    lg = masked(st, c, raw)
    assert tok.decode([int(lg[0].argmax()), int(lg[2].argmax())]) == "4}"
    assert torch.equal(lg[4], raw[4])  # past the rejected draft: untouched
    # a row whose top candidate (TOP_K 1 here) is not allowed ends the chain there, masked itself
    monkeypatch.setattr("dlmrt.engine.block.structured.TOP_K", 1)
    c2 = grammars.constraint(FMT, 32)
    c2.take(c2.forced())
    st2 = _Block([MASK] * 3, [True] * 3, 0, 3, MASK, STOP)
    lg2 = masked(st2, c2, _logits(tok, ["4", " 5", " 5"]))
    assert int(lg2[0].argmax()) == tok.encode("4")[0]
    assert not lg2[1].isfinite().all() and torch.equal(lg2[2], _logits(tok, [" 5"])[0])


def test_the_start_states_closing_is_searched_once_per_grammar_and_budget(
    tok, grammars, monkeypatch
):
    """Every request of a grammar starts in the same state: `Grammars.first_closing` searches
    its closing once per (grammar, budget) and hands each request the same sequence."""
    from dlmrt.structured import grammar

    searches = []
    search = grammar.closing
    monkeypatch.setattr(grammar, "closing", lambda *a: searches.append(1) or search(*a))
    fmt = parse({"type": "regex", "regex": r"(ab )*done"})
    first = grammars.constraint(fmt, 40)
    assert len(searches) == 1 and tok.decode(first.closing).endswith("done")
    again = grammars.constraint(fmt, 40)
    assert len(searches) == 1 and again.closing == first.closing
    again.take(again.closing[:1])
    assert (
        again.closing == first.closing[1:] and first.closing == grammars.constraint(fmt, 40).closing
    )
    other = grammars.constraint(fmt, 41)  # another budget: its own search
    assert len(searches) == 2 and other.closing == first.closing
    with pytest.raises(ValueError, match="cannot hold any document"):
        grammars.constraint(fmt, 1)
    with pytest.raises(ValueError, match="cannot hold any document"):
        grammars.constraint(fmt, 1)  # a failed search is remembered too
    assert len(searches) == 3


def test_the_packed_mask_reads_as_the_unpacked_one():
    """closing.Mask (the search's view of llguidance's packed words) against the [vocab] bool
    array the words unpack to: the same members, the same first ids, past the last word too."""
    import numpy as np

    from dlmrt.structured.closing import Mask

    rng = np.random.default_rng(0)
    for size, density in ((37, 0.3), (512, 0.01), (151_936, 0.0001), (70, 0.0)):
        words = rng.integers(0, 2**31, (size + 31) // 32, dtype=np.int64).astype(np.int32)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:size].astype(bool)
        keep = rng.random(size) < density
        words = np.packbits(bits & keep, bitorder="little")
        words = np.pad(words, (0, (-len(words)) % 4)).view(np.int32)
        want = np.unpackbits(words.view(np.uint8), bitorder="little")[:size].astype(bool)
        mask = Mask(words, size)
        ids = np.arange(size, dtype=np.int64)
        assert np.array_equal(mask.allows(ids), want)
        assert mask.first(9) == np.flatnonzero(want)[:9].tolist()
        assert mask.key() == Mask(words.copy(), size).key()
        if size % 32:  # a bit set past the last token is not a member
            extra = words.copy()
            extra.view(np.uint32)[-1] |= np.uint32(1 << 31)
            assert Mask(extra, size).first(size) == np.flatnonzero(want).tolist()


@pytest.mark.parametrize(
    "schema,prefix,want",
    [
        ({"type": "array", "items": {"type": "string"}, "minItems": 3}, '["x', '","",""]'),
        ({"type": "array", "items": {"type": "string"}, "minItems": 3}, '["x","y","z', '"]'),
        (
            {
                "type": "array",
                "items": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                "minItems": 2,
            },  # fmt: skip
            '[["a',
            '",""],["",""]]',
        ),
    ],
)
def test_the_closing_search_finds_the_shortest_completion(tok, grammars, schema, prefix, want):
    """States inside strings share one allowed-set at every nesting depth and item count; the
    search's memo of allowed-sets that found nothing (at a depth and any deeper one) must not
    cut the shortest completion off."""
    from dlmrt.structured.closing import closing

    c = grammars.constraint(parse({"type": "json_schema", "json_schema": {"schema": schema}}), 64)
    ids = tok.encode(prefix)
    assert c.take(ids) == len(ids)
    assert tok.decode(closing(c.m, grammars.order, c._mask, 40)) == want
