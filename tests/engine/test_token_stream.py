"""The round stream (engine/block/row_stream.py) and the token feed (engine/block/token_feed.py):
a request's tokens reach `on_tokens` as they become final, every round, never retracted, and the
last call is the output (CPU; the block_graph ring written by the CUDA kernel: the GPU file)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM
from dlmrt.blocks import layout
from dlmrt.engine.block.row_stream import RowStream, Slot, payload
from dlmrt.engine.block.token_feed import TokenFeed

KW = dict(max_new_tokens=20, ignore_eos=True)


def _buf(rows: list[int], unresolved: list[bool], step: int, start: int = 8, accepted=None):
    n = len(rows)
    return SimpleNamespace(
        canvas=torch.tensor(rows),
        unresolved=torch.tensor(unresolved),
        step=torch.tensor(step),
        block_start=torch.tensor(start),
        accepted=torch.tensor(accepted or [False] * n),
        edited=torch.zeros(n, dtype=torch.bool),
        entropy=torch.zeros(n),
    )


def _rows(ring: RowStream) -> tuple[int, list[int]] | None:
    """(block start, rows) of the newest round read, or None."""
    slots = ring.poll()
    return (slots[-1].block_start, slots[-1].rows) if slots else None


def test_a_slot_is_the_round_the_block_start_and_the_resolved_rows():
    buf = _buf([5, 6, 7], [False, True, False], step=3)
    assert payload(buf).tolist() == [3, 8, 0, 5, -1, 7]
    buf.entropy[1] = float("nan")
    assert payload(buf).tolist() == [3, 8, 1, 5, -1, 7]  # a non-finite round is flagged


def test_a_draft_slot_shows_proposals_states_and_probabilities():
    buf = _buf([5, 6, 7], [False, True, False], step=1, accepted=[False, False, True])
    proposal = SimpleNamespace(
        tokens=torch.tensor([1, 2, 3]), confidence=torch.tensor([0.1, 0.25, 0.5])
    )
    ring = RowStream(rows=3, device=torch.device("cpu"), drafts=True, slots=4)
    ring.publish(buf, SimpleNamespace(proposal=proposal))
    (slot,) = ring.poll()
    assert slot.round == 1 and slot.rows == [5, -1, 7]
    assert slot.shown == [5, 2, 7]  # the masked row shows its proposal
    assert slot.states == [0, 2, 1]  # final, masked, accepted this round
    assert slot.confidence == [1.0, 0.25, 0.5]


def test_the_reader_takes_rounds_in_order_and_returns_the_newest():
    ring = RowStream(rows=2, device=torch.device("cpu"), slots=4)
    assert ring.poll() == []
    ring.publish(_buf([1, 2], [False, True], step=1))
    ring.publish(_buf([1, 2], [False, False], step=2))
    assert [(s.round, s.rows) for s in ring.poll()] == [(1, [1, -1]), (2, [1, 2])]
    assert ring.poll() == [] and ring.overruns == 0
    ring.publish(_buf([1, 3], [False, False], step=3))
    assert _rows(ring) == (8, [1, 3])


def test_a_lapped_reader_skips_to_the_oldest_round_left_and_counts_what_it_missed():
    ring = RowStream(rows=1, device=torch.device("cpu"), slots=3)
    for step in range(1, 6):  # rounds 1..5 into 3 slots: 1 and 2 are overwritten
        ring.publish(_buf([10 + step], [False], step=step))
    assert [s.round for s in ring.poll()] == [3, 4, 5]
    assert ring.overruns == 2
    ring.publish(_buf([16], [False], step=6))
    assert _rows(ring) == (8, [16]) and ring.overruns == 2


def test_a_slot_being_written_is_not_read_until_its_round_is_written_last():
    ring = RowStream(rows=1, device=torch.device("cpu"), slots=4)
    ring.publish(_buf([4], [False], step=1))
    ring.ring[1, 0] = 0  # the writer zeroes the round first (csrc/slot_publish.cu)
    assert ring.poll() == []
    ring.ring[1, 0] = 1  # ... and writes it last
    assert _rows(ring) == (8, [4])


def test_clear_forgets_every_slot():
    ring = RowStream(rows=1, device=torch.device("cpu"), slots=4)
    ring.publish(_buf([4], [False], step=1))
    ring.clear()
    assert ring.poll() == []
    ring.publish(_buf([5], [False], step=1))  # the next block starts again at round 1
    assert _rows(ring) == (8, [5])


class _Rows:
    """A round stream that returns what the test queued."""

    def __init__(self) -> None:
        self.queue: list = []

    def poll(self):
        if not self.queue:
            return []
        start, rows = self.queue.pop(0)
        bad = start < 0  # a negative start in a test's queue: a non-finite round of block 1
        return [Slot(1, abs(start), bad, rows, None, None, None, 0)]

    def clear(self) -> None:
        pass


def _feed(stop_ids=frozenset(), max_new_tokens=12):
    calls: list[list[int]] = []
    rows = _Rows()
    lay = layout(5, max_new_tokens, 4)  # prompt 5, B 4: block 1 holds 1 prompt row (the tail)
    feed = TokenFeed(calls.append, lay, set(stop_ids), max_new_tokens, False, rows)
    return feed, rows, calls


def test_the_feed_hands_over_the_resolved_rows_up_to_the_first_masked_one():
    feed, rows, calls = _feed()
    feed.start_block(1, [])
    rows.queue = [(4, [99, 7, -1, 9])]  # row 0 is the prompt's tail; row 2 still masked
    feed.poll()
    rows.queue = [(4, [99, 7, 8, 9])]
    feed.poll()
    feed.poll()  # nothing new: no call
    assert calls == [[7], [7, 8, 9]]


def test_the_feed_ignores_another_blocks_rows_and_cuts_at_a_stop_id():
    feed, rows, calls = _feed(stop_ids={8})
    feed.offer([1, 2, 3])  # block 1 finished
    feed.start_block(2, [1, 2, 3])
    rows.queue = [(4, [5, 5, 5, 5])]  # block 1's start: stale, ignored
    feed.poll()
    rows.queue = [(8, [4, 8, 6, -1])]
    feed.poll()
    assert calls == [[1, 2, 3], [1, 2, 3, 4, 8]]  # cut after the stop id, as the output is


def test_the_feed_takes_nothing_from_a_non_finite_round_on():
    feed, rows, calls = _feed()
    feed.start_block(1, [])
    rows.queue = [(4, [99, 7, -1, -1]), (-4, [99, 7, 8, 9]), (4, [99, 7, 8, 9])]
    feed.poll()
    feed.poll()
    feed.poll()
    assert calls == [[7]]


def test_the_feed_never_hands_over_less_than_before():
    feed, rows, calls = _feed(max_new_tokens=5)
    feed.start_block(1, [])
    rows.queue = [(4, [99, 1, 2, 3])]
    feed.poll()
    feed.offer([1, 2])  # shorter: ignored
    feed.start_block(2, [1, 2, 3])
    rows.queue = [(8, [4, 5, 6, 7])]
    feed.poll()
    assert calls == [[1, 2, 3], [1, 2, 3, 4, 5]]  # max_new_tokens cuts it


def _stream(llm: LLM, prompt, **kw):
    """(the on_tokens calls, the output, how many calls came before each block's on_progress:
    a block's own end-of-block call comes after it, so i + 1 .. means calls inside the block)."""
    calls: list[list[int]] = []
    marks: list[int] = []
    out = llm.generate(
        prompt,
        on_tokens=calls.append,
        on_progress=lambda i, r, t: marks.append(len(calls)),
        **kw,
    )
    return calls, out, marks


def _check_stream(calls: list[list[int]], out) -> None:
    assert calls and calls[-1] == out.token_ids
    for before, after in zip(calls, calls[1:]):
        assert len(after) > len(before) and after[: len(before)] == before  # never retracted


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    return {
        "qwen-orl": write_checkpoint(root / "q", residual=residual_config()),
        "llada2": write_llada2_checkpoint(root / "l", seed=1),
    }


SLOW = dict(rule="threshold", threshold=0.99)  # about one row a round: many rounds a block


@pytest.mark.parametrize("fold", [True, False])
def test_tokens_arrive_inside_the_block_and_end_as_the_output(checkpoints, fold):
    llm = LLM(checkpoints["qwen-orl"], device="cpu", fold_commits=fold, prefix_reuse=False)
    calls, out, marks = _stream(llm, list(range(3, 14)), **KW, **SLOW)
    _check_stream(calls, out)
    assert len(calls) > len(out.rounds_per_block)  # more calls than blocks: by rounds
    # some block's first rows came before the block ended: more calls than blocks finished
    assert any(m > i for i, m in enumerate(marks))
    assert llm.generate(list(range(3, 14)), **KW, **SLOW).token_ids == out.token_ids


def test_without_stream_rounds_tokens_arrive_once_a_block(checkpoints):
    llm = LLM(checkpoints["qwen-orl"], device="cpu", stream_rounds=False, prefix_reuse=False)
    calls, out, marks = _stream(llm, list(range(3, 14)), **KW, **SLOW)
    _check_stream(calls, out)
    assert len(calls) <= len(out.rounds_per_block) and marks == list(range(len(marks)))


def test_an_editing_rule_streams_by_blocks(checkpoints):
    llm = LLM(checkpoints["llada2"], device="cpu", prefix_reuse=False)
    calls, out, marks = _stream(llm, list(range(3, 14)), rule="llada_editing", **KW)
    _check_stream(calls, out)
    assert marks == list(range(len(marks)))  # one call per block, at its end


def test_drafts_keep_the_text_behind_their_block(checkpoints):
    """A request with drafts streams its text by blocks: a block's drafts come first."""
    llm = LLM(checkpoints["qwen-orl"], device="cpu", prefix_reuse=False)
    events: list[str] = []
    out = llm.generate(
        list(range(3, 14)),
        on_tokens=lambda t: events.append("tokens"),
        on_round=lambda d: events.append("final" if d.final else "draft"),
        **KW,
        **SLOW,
    )
    assert events.count("final") == len(out.rounds_per_block)
    for i, e in enumerate(events):
        if e == "tokens":
            assert events[i - 1] == "final"


def test_the_demo_streams_what_it_answers():
    llm = LLM(device="cpu")
    prompt = "Tom has 12 apples and buys 7 more, then gives away 5. How many now?"
    calls, out, _ = _stream(llm, prompt, chat=True, max_new_tokens=64)
    _check_stream(calls, out)
    assert llm.tokenizer.decode(calls[-1]) == out.text


def test_a_structured_request_streams_the_rows_its_grammar_consumed():
    pytest.importorskip("llguidance")
    llm = LLM(device="cpu")
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    calls, out, marks = _stream(llm, "What is 3 + 4?", max_new_tokens=48, response_format=fmt)
    _check_stream(calls, out)
    assert any(m > i for i, m in enumerate(marks))  # before the block ended


@pytest.mark.parametrize("rule", [SLOW, {"rule": "llada_editing"}])
def test_live_drafts_are_the_drafts_built_from_records(checkpoints, rule):
    """Drafts from the round stream (no recorder) equal those built from the trace's records."""
    name = "llada2" if rule["rule"] == "llada_editing" else "qwen-orl"
    llm = LLM(checkpoints[name], device="cpu", prefix_reuse=False)
    live: list = []
    traced: list = []
    out = llm.generate(list(range(3, 14)), on_round=live.append, **KW, **rule)
    ref = llm.generate(
        list(range(3, 14)), on_round=traced.append, recorder=lambda r: None, **KW, **rule
    )
    assert out.token_ids == ref.token_ids and live == traced
    assert len(live) == sum(out.rounds_per_block) and live[-1].final
    assert out.num_commit_forwards > 0  # drafts run unfolded, live or not


class _Replay:
    """A captured body, emulated on the CPU: replaying it runs the body 'inside the graph'."""

    capturing = False

    def __init__(self, fn) -> None:
        self.fn = fn

    def replay(self) -> None:
        _Replay.capturing = True
        try:
            self.fn()
        finally:
            _Replay.capturing = False


def _emulated_capture(fn, stream, pool) -> _Replay:
    for _ in range(2):  # capture.warm_up's real runs, before the buffers of the block are loaded
        fn()
    return _Replay(fn)


@pytest.mark.parametrize("fold", [True, False])
def test_round_graph_streams_only_what_its_graphs_publish(checkpoints, fold, monkeypatch):
    """round_graph captures each body at its first run; the warm-up runs come out of order (the
    rounds' before the block is loaded) and must neither publish nor change the tokens."""
    import dlmrt.engine.block.row_stream as row_stream
    import dlmrt.engine.graph.loop as loop
    import dlmrt.engine.graph.workspace as workspace

    class CpuRoundGraph(loop.RoundGraphRunner):
        def __init__(self, pool) -> None:
            self.pool, self.stream, self.graphs = pool, None, {}

    prompt, opts = list(range(3, 14)), dict(fold_commits=fold, prefix_reuse=False)
    eager = LLM(checkpoints["qwen-orl"], device="cpu", **opts).generate(prompt, **KW, **SLOW)
    monkeypatch.setattr(loop, "capture", _emulated_capture)
    monkeypatch.setattr(workspace, "make_runner", lambda mode, pool: CpuRoundGraph(pool))
    monkeypatch.setattr(
        row_stream.torch.cuda, "is_current_stream_capturing", lambda: _Replay.capturing
    )
    llm = LLM(checkpoints["qwen-orl"], device="cpu", **opts)
    calls, out, marks = _stream(llm, prompt, **KW, **SLOW)
    assert out.token_ids == eager.token_ids
    _check_stream(calls, out)
    assert any(m > i for i, m in enumerate(marks))  # rounds read inside the block


def test_a_listener_error_mid_block_is_raised_after_should_stop_is_called(checkpoints):
    """A stop string found mid-block (the server raises from on_tokens): should_stop is still
    called that round (under tensor parallelism a collective), then the error surfaces."""
    llm = LLM(checkpoints["qwen-orl"], device="cpu", prefix_reuse=False)
    seen: list[str] = []

    def on_tokens(tokens: list[int]) -> None:
        seen.append("tokens")
        raise KeyError("stop string")

    def should_stop() -> bool:
        seen.append("stop")
        return False

    with pytest.raises(KeyError, match="stop string"):
        llm.generate(list(range(3, 14)), on_tokens=on_tokens, should_stop=should_stop, **KW, **SLOW)
    assert seen[-2:] == ["tokens", "stop"] and seen.count("tokens") == 1
    calls, out, _ = _stream(llm, list(range(3, 14)), **KW, **SLOW)  # the engine serves the next
    _check_stream(calls, out)


def test_a_structured_request_streams_by_blocks_without_stream_rounds():
    pytest.importorskip("llguidance")
    llm = LLM(device="cpu", stream_rounds=False)
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    calls, out, marks = _stream(llm, "What is 3 + 4?", max_new_tokens=48, response_format=fmt)
    _check_stream(calls, out)
    assert marks == list(range(len(marks)))
