"""The grammar state on its own (llguidance over the demo tokenizer): the walk's building blocks."""

from __future__ import annotations

import pytest

pytest.importorskip("llguidance")

from dlmrt.demo import demo_model_path  # noqa: E402
from dlmrt.engine.block.structured import _Block, settle  # noqa: E402
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
