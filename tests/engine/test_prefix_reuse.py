"""Prefix reuse (engine/prefix.py), block style: a request reuses the whole blocks its prompt
shares with the rows earlier requests committed, and decodes exactly what a cold request decodes
(CPU, fp32). DiffusionGemma's: test_prefix_reuse_dg.py.

Every expected reuse count is derived from the block layout alone: after a request that ran to its
length, rows [0, (num_blocks - 1) * B) hold committed K/V (its prompt's full blocks and every
generated block but the last, whose commit pass never runs).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM
from dlmrt.blocks import layout
from dlmrt.decoding import make_rule
from dlmrt.engine.prefix import Prefix, common_prefix
from dlmrt.errors import GenerationCancelled

B = 8  # the tiny checkpoints' block size
KW = dict(max_new_tokens=20, ignore_eos=True)
# checkpoint writer, LLM options, decoding options: both block families, folded and unfolded
# commits, a folded editing check (LLaDA2 Base) and a commit-only fold (LLaDA2 "block" adapter)
CASES = {
    "qwen-base": (write_checkpoint, {}, {"rule": "threshold", "threshold": 0.25}),
    "qwen-orl-unfolded": (
        lambda p: write_checkpoint(p, residual=residual_config()),
        {"fold_commits": False},
        {},
    ),
    "llada2": (lambda p: write_llada2_checkpoint(p, seed=1), {}, {}),
    "llada2-block": (
        lambda p: write_llada2_checkpoint(
            p, seed=1, residual=residual_config("block", post_norm_scale=None, output_scale=0.01)
        ),
        {},
        {},
    ),
}


def _ids(n: int, salt: int = 0) -> list[int]:
    return [(37 * i + 11 + salt) % 200 + 3 for i in range(n)]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """case -> (an LLM with prefix reuse, the same checkpoint without)."""
    root = tmp_path_factory.mktemp("prefix")
    out = {}
    for name, (write, opts, _) in CASES.items():
        path = write(root / name)
        out[name] = (
            LLM(path, device="cpu", **opts),
            LLM(path, device="cpu", prefix_reuse=False, **opts),
        )
    return out


def _committed_rows(prompt_len: int, max_new_tokens: int) -> int:
    """Rows a request that ran to its length leaves committed (every block but its last)."""
    return (layout(prompt_len, max_new_tokens, B).num_blocks - 1) * B


@pytest.mark.parametrize("case", list(CASES))
def test_a_conversation_decodes_as_cold_and_reuses_the_committed_blocks(pairs, case):
    llm, cold = pairs[case]
    opts = {**KW, **CASES[case][2]}
    ids: list[int] = []
    before = 0  # rows committed by the previous turn
    for turn, new in enumerate((_ids(13), _ids(5, 1), _ids(11, 2))):
        ids = ids + new
        out, ref = llm.generate(ids, **opts), cold.generate(ids, **opts)
        assert out.token_ids == ref.token_ids, (case, turn)
        assert ref.num_cached_tokens == 0
        want = min(before, len(ids) // B * B) if turn else 0
        assert out.num_cached_tokens == want, (case, turn)
        assert out.num_prefill_forwards == int(want < len(ids) // B * B)
        before = _committed_rows(len(ids), KW["max_new_tokens"])
        ids = ids + out.token_ids
    assert want > 13 // B * B  # generated blocks were reused, not only the first prompt's


def test_the_demo_conversation_is_identical_and_its_reused_kv_is_a_cold_prefills():
    """The embedded demo model in fp32, three turns of text: the same tokens with reuse as cold,
    and the reused rows hold what a cold prefill of the same prompt writes."""
    llm, cold = LLM(device="cpu"), LLM(device="cpu", prefix_reuse=False)
    block, tok = llm.model_config.block_size, llm.tokenizer
    ids: list[int] = []
    questions = (
        "Tom has 23 apples. He buys 15 more. How many apples now?",
        " Sam has 40 pears. He eats 12. How many pears now?",
        " Ann has 7 boxes of 6 eggs. How many eggs?",
    )
    cached = []
    for q in questions:
        ids = ids + tok.encode(q)
        out, ref = llm.generate(ids, max_new_tokens=48), cold.generate(ids, max_new_tokens=48)
        assert out.token_ids == ref.token_ids and out.text == ref.text
        cached.append(out.num_cached_tokens)
        ids = ids + out.token_ids
    assert cached[0] == 0 and all(c > 0 and c % block == 0 for c in cached[1:])
    rows = len(ids) // block * block  # compare the last turn's prompt rows, cold vs reused
    k, v = llm.engine.workspace.arena.k, llm.engine.workspace.arena.v
    ck, cv = cold.engine.workspace.arena.k, cold.engine.workspace.arena.v
    prompt_rows = (len(ids) - len(out.token_ids)) // block * block
    assert 0 < cached[-1] <= prompt_rows < rows
    tol = dict(rtol=1e-5, atol=1e-5)  # the commit passes' GEMMs block rows unlike a prefill's
    torch.testing.assert_close(k[:, :, :prompt_rows], ck[:, :, :prompt_rows], **tol)
    torch.testing.assert_close(v[:, :, :prompt_rows], cv[:, :, :prompt_rows], **tol)


def test_divergence_reuses_only_the_blocks_before_it(pairs):
    llm, cold = pairs["qwen-base"]
    opts = dict(max_new_tokens=8, ignore_eos=True, rule="threshold", threshold=0.25)
    first = _ids(5 * B + 3, salt=5)  # shares no block with the other tests' prompts
    assert llm.generate(first, **opts).num_cached_tokens == 0

    def reused(prompt: list[int]) -> int:
        out = llm.generate(prompt, **opts)
        assert out.token_ids == cold.generate(prompt, **opts).token_ids
        return out.num_cached_tokens

    inside = first[: 2 * B + 5] + [first[2 * B + 5] + 1] + first[2 * B + 6 :]
    assert reused(inside) == 2 * B  # block 2 differs in one row: blocks 0 and 1 only
    # the prompt above overwrote rows from block 2 on: its blocks 2.. are what is held now
    assert reused(first) == 2 * B
    assert reused(first[: 4 * B]) == 4 * B  # block-aligned, all held: no prefill at all
    assert llm.generate(first[: 4 * B], **opts).num_prefill_forwards == 0
    assert reused(_ids(5 * B + 3, salt=1)) == 0  # fully different
    assert reused(first[:5]) == 0  # shorter than a block: nothing is prefilled
    assert reused(first) == 0  # ... and that request wrote block 0: nothing of `first` is held
    out = llm.generate(first, **opts)
    assert out.num_cached_tokens == 5 * B
    assert reused(first + out.token_ids) == 6 * B  # its first generated block was committed
    # another block length lays K/V out differently: nothing is reused
    assert llm.generate(first, **{**opts, "block_length": 4}).num_cached_tokens == 0


def test_an_empty_prompt_reuses_nothing_and_forgets_what_it_overwrote(pairs):
    llm, _ = pairs["qwen-base"]
    prompt = _ids(3 * B)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([], max_new_tokens=8)  # LLM refuses it
    llm.generate(prompt, max_new_tokens=8, ignore_eos=True)
    assert llm.generate(prompt, max_new_tokens=8, ignore_eos=True).num_cached_tokens == 3 * B
    kw = dict(block_length=B, mask_id=llm.mask_id, stop_ids=set(), ignore_eos=True)
    res = llm.engine.generate([], rule=make_rule("threshold"), max_new_tokens=16, **kw)
    assert res.cached_tokens == 0 and res.prefill_forwards == 0
    assert llm.generate(prompt, max_new_tokens=8, ignore_eos=True).num_cached_tokens == 0


@pytest.mark.parametrize("polls_after", [1, 3])
@pytest.mark.parametrize("fold", [True, False])
def test_a_request_cancelled_mid_block_keeps_only_what_it_committed(pairs, fold, polls_after):
    """fixed_steps: 8 rounds per block; the cancel comes at the 1st poll after block 2's output
    (folded: before the joint pass that would commit block 2) or the 3rd (inside block 3, whose
    rows hold scratch K/V). Unfolded, blocks 0-1 (prompt) and 2 (its commit pass ran) are held;
    folded, block 2's commit rides in block 3's chain, which the cancel cut: only the prompt's
    blocks (even where the joint pass had run: the engine counts a commit once its chain ends)."""
    llm, cold = pairs["qwen-base" if fold else "qwen-orl-unfolded"]
    opts = dict(max_new_tokens=40, ignore_eos=True, rule="fixed_steps")
    prompt, emitted, polls = _ids(2 * B + 3), [], []

    def stop() -> bool:
        polls.append(bool(emitted))
        return sum(polls) >= polls_after

    with pytest.raises(GenerationCancelled):
        llm.generate(
            prompt, should_stop=stop, on_progress=lambda i, r, t: emitted.append(t), **opts
        )
    assert len(emitted) == 1  # block 2 finished, block 3 was cut
    held = llm.engine.prefix.ids
    assert held == (prompt + emitted[-1])[: (2 if fold else 3) * B]
    follow = prompt + emitted[-1] + _ids(6, salt=3)
    out = llm.generate(follow, **opts)
    assert out.num_cached_tokens == len(held)
    assert out.token_ids == cold.generate(follow, **opts).token_ids


@pytest.mark.parametrize("case", ["qwen-base", "qwen-orl-unfolded", "llada2"])
def test_a_request_stopped_from_its_progress_callback_keeps_no_uncommitted_block(pairs, case):
    """The server ends a request by raising from `on_progress` (a stop string, a disconnect). The
    block just handed over is not committed yet (its commit pass, folded or not, comes after it),
    except where its editing check rode in the joint pass that commits it (LLaDA2 Base): that
    block's tokens are handed over only once that pass has written their K/V."""
    llm, _ = pairs[case]
    prompt, seen = _ids(2 * B + 3), []

    def stop(index, rounds, tokens):
        seen.append(tokens)
        raise RuntimeError("client left")

    with pytest.raises(RuntimeError, match="client left"):
        llm.generate(prompt, on_progress=stop, **KW)
    blocks = 3 if case == "llada2" else 2
    assert llm.engine.prefix.ids == (prompt + seen[0])[: blocks * B]


def test_common_prefix_and_a_disabled_prefix():
    assert common_prefix([1, 2, 3, 4, 5], [1, 2, 3, 4, 9], 2) == 4
    assert common_prefix([1, 2, 3], [1, 2, 3, 4], 2) == 2
    assert common_prefix([], [1, 2], 1) == 0
    off, arena = Prefix(enabled=False), object()
    off.take([1, 2, 3, 4], 2, arena, 4)
    off.commit(0, [1, 2, 3, 4])
    assert off.take([1, 2, 3, 4], 2, arena, 4) == 0 and off.ids == []
    on = Prefix()
    assert on.take([1, 2, 3, 4], 2, arena, 4) == 0
    on.commit(0, [1, 2, 3, 4])
    assert on.take([1, 2, 3, 4], 2, arena, 4) == 4
    assert on.take([1, 2, 3, 4], 2, object(), 4) == 0  # another arena (it grew): nothing held
    on.commit(2, [3, 4])  # a gap after the held rows: not kept
    assert on.ids == []


def test_the_controls(pairs, tmp_path):
    """On through `LLM` by default, off with prefix_reuse=False, `--no-prefix-reuse` (serve,
    generate), and for `LLM.from_model` (a trained model's weights change between requests)."""
    from dlmrt.cli import build_parser

    llm, cold = pairs["qwen-base"]
    assert llm.engine.prefix.enabled and not cold.engine.prefix.enabled
    live = LLM.from_model(llm.model, llm.tokenizer, path=llm.path)
    assert not live.engine.prefix.enabled
    parser = build_parser()
    for command in (["serve"], ["generate", "hi"]):
        assert parser.parse_args(command).prefix_reuse is True
        assert parser.parse_args([*command, "--no-prefix-reuse"]).prefix_reuse is False


@pytest.mark.parametrize("reuse", [True, False])
def test_an_arena_growth_frees_the_old_arena_before_allocating_the_new(
    tmp_path, monkeypatch, reuse
):
    """Workspace.reserve drops the old arena before allocating: nothing else (the prefix's
    bookkeeping included) may keep it alive, or growth peaks at old + new."""
    from dlmrt.engine.block import engine as block_engine
    from dlmrt.engine.graph import workspace

    monkeypatch.setattr(workspace, "ARENA_QUANTUM", 16)
    llm = LLM(write_checkpoint(tmp_path / "q"), device="cpu", prefix_reuse=reuse)
    llm.generate(_ids(13), **KW)
    old = weakref.ref(llm.engine.workspace.arena)
    alive = []

    def new_cache(*args):
        gc.collect()
        alive.append(old() is not None)
        return block_engine_cache(*args)

    block_engine_cache = block_engine.KVCache
    monkeypatch.setattr(block_engine, "KVCache", new_cache)
    out = llm.generate(_ids(13) + _ids(30, 1), **KW)
    assert alive == [False] and out.num_cached_tokens == 0
    assert llm.engine.workspace.arena.max_len > 16


def test_a_disabled_prefix_runs_no_collective_and_holds_no_arena(monkeypatch):
    """Reuse off: `take` answers 0 without the tensor-parallel agreement (an all-reduce per
    request for nothing) and keeps no reference to the arena."""
    from dlmrt.engine import prefix

    def agreed(n: int) -> int:
        raise AssertionError("a disabled prefix must not run the ranks' agreement")

    monkeypatch.setattr(prefix, "_agreed", agreed)
    off = Prefix(enabled=False)
    assert off.take([1, 2, 3, 4], 2, object(), 4) == 0
    assert off.arena is None and off.ids == [] and off.reused == 0
    with pytest.raises(AssertionError, match="agreement"):
        Prefix().take([1, 2, 3, 4], 2, object(), 4)  # enabled: the ranks agree
