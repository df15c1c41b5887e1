"""Prefill per length bucket (engine/graph/prefill.py): the buckets, and that padding changes nothing.

CPU: the padded forward runs eagerly (no graphs) over the same static buffers the graph modes
capture; its K/V for the prompt rows equal the unpadded prefill's, and a request whose prefill is
padded (and chunked) gives the same tokens. The captured graphs themselves: tests/engine/test_overhead_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint
from dg_helpers import SETTINGS, ckpt  # noqa: F401
from dg_helpers import _prompt as dg_prompt

from dlmrt import LLM
from dlmrt.engine.graph import prefill
from dlmrt.engine.graph.prefill import MAX_GRAPH_ROWS, bucket_rows, chunks


@pytest.mark.parametrize("block", [4, 16, 32])
def test_buckets_cover_each_length_with_bounded_padding(block):
    buckets = set()
    for rows in range(block, MAX_GRAPH_ROWS + 1, block):
        bucket = bucket_rows(rows, block)
        assert bucket is not None and bucket % block == 0 and bucket >= rows
        assert 3 * (bucket - rows) <= bucket  # at most a third of a bucket is padding
        buckets.add(bucket)
    assert bucket_rows(max(buckets), block) == max(buckets)  # a bucket is its own bucket
    assert len(buckets) <= 2 * (MAX_GRAPH_ROWS // block).bit_length()  # few graphs
    assert bucket_rows(MAX_GRAPH_ROWS + block, block) is None  # longer: chunks
    for rows in (block, MAX_GRAPH_ROWS, 3 * MAX_GRAPH_ROWS + 5 * block):
        plan = chunks(rows, block)
        starts = [s for s, _ in plan]
        assert starts == list(range(0, rows, starts[1] if len(plan) > 1 else rows))
        assert all(b <= MAX_GRAPH_ROWS for _, b in plan)
        assert plan[-1][0] + plan[-1][1] >= rows  # every row is in a chunk
    for bad in (0, block + 1):
        with pytest.raises(ValueError, match="multiple"):
            bucket_rows(bad, block)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write_checkpoint(tmp_path_factory.mktemp("prefill"), residual=residual_config("masked"))
    return LLM(path, device="cpu", prefix_reuse=False)  # every request prefills its prompt


def _prompt(n: int) -> list[int]:
    return [(29 * i + 5) % 256 for i in range(n)]


@pytest.mark.parametrize("max_rows", [2048, 24])  # 24: chunks of six blocks, the last padded
def test_padded_prefill_writes_the_same_prompt_kv(llm, monkeypatch, max_rows):
    monkeypatch.setattr(prefill, "MAX_GRAPH_ROWS", max_rows)
    engine, block = llm.engine, 4
    rows = 11 * block  # padded to 12 blocks: one bucket, or 6 blocks + 5 padded to 6
    assert sum(b for _, b in chunks(rows, block)) == 12 * block
    plain, padded = engine._new_arena(64), engine._new_arena(64)
    with torch.inference_mode():
        engine.prefill(_prompt(rows), block, plain)
        assert engine.prefill_graphs(padded).run(_prompt(rows), block)
    # [layers, kv_heads, rows, head_dim]: the prompt rows agree (to the GEMMs' rounding: the CPU
    # BLAS blocks M = 44 and M = 48 rows differently; a visible padded row would move them O(1)),
    # and the padding wrote its own rows
    k, v, tol = padded.k[:, :, :rows], padded.v[:, :, :rows], dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, plain.k[:, :, :rows], **tol)
    torch.testing.assert_close(v, plain.v[:, :, :rows], **tol)
    assert padded.k[:, :, rows : 12 * block].abs().sum() > 0
    assert plain.k[:, :, rows:].abs().sum() == 0


@pytest.mark.parametrize("prompt_len,max_rows", [(21, 2048), (37, 2048), (70, 2048), (70, 24)])
def test_padded_prefill_gives_the_same_tokens(llm, monkeypatch, prompt_len, max_rows):
    kw = dict(rule="threshold", threshold=0.25, block_length=4, max_new_tokens=12, ignore_eos=True)
    want = llm.generate(_prompt(prompt_len), **kw).token_ids
    engine, runs = llm.engine, []

    def padded(tokens, block_length, kv, start=0):
        runs.append(sum(b for _, b in chunks(len(tokens), block_length)) - len(tokens))
        assert engine.prefill_graphs(kv).run(tokens, block_length, start)

    monkeypatch.setattr(engine, "prefill", padded)
    monkeypatch.setattr(prefill, "MAX_GRAPH_ROWS", max_rows)
    assert llm.generate(_prompt(prompt_len), **kw).token_ids == want
    assert runs and runs[0] > 0  # the prefill was padded


def test_padded_encoder_pass_gives_the_same_context_and_tokens(ckpt, monkeypatch):  # noqa: F811
    """DiffusionGemma: the prompt's encoder pass padded to ENCODE_GRANULE writes the same context
    K/V (prompt 13 > the sliding window), also when it starts at a reused prefix's end (any row:
    the encoder is causal), and a padded, chunked one decodes the same tokens."""
    from dlmrt.decoding import entropy_bound_canvas as ebc
    from dlmrt.engine import EncoderDecoderEngine
    from dlmrt.engine.encoder_decoder.engine import ENCODE_GRANULE
    from dlmrt.engine.encoder_decoder.step import encode
    from dlmrt.engine.kv_cache import ContextArena
    from dlmrt.loading.checkpoint import load_checkpoint

    model = load_checkpoint(ckpt[0], torch.float32, torch.device("cpu")).model
    engine = EncoderDecoderEngine(model, torch.device("cpu"), "eager")
    prompt, dtype, cpu = dg_prompt(13, 1), torch.float32, torch.device("cpu")
    plain, padded, resumed = (ContextArena(model.cfg, 64, dtype, cpu) for _ in range(3))
    with torch.inference_mode():
        encode(model, plain, torch.tensor(prompt), torch.zeros((), dtype=torch.long))
        assert engine.encoder_graphs(padded).run(prompt, ENCODE_GRANULE)
        encode(model, resumed, torch.tensor(prompt[:5]), torch.zeros((), dtype=torch.long))
        assert engine.encoder_graphs(resumed).run(prompt, ENCODE_GRANULE, 5)  # rows 5 .. 20
    for a, b, c in zip(plain.k + plain.v, padded.k + padded.v, resumed.k + resumed.v, strict=True):
        torch.testing.assert_close(b[:, : len(prompt)], a[:, : len(prompt)], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c[:, : len(prompt)], a[:, : len(prompt)], rtol=1e-5, atol=1e-5)
    s = ebc.CanvasSettings(**SETTINGS[0])
    kw = dict(max_new_tokens=20, stop_ids=[], seed=3)
    monkeypatch.setattr(prefill, "MAX_GRAPH_ROWS", 16)
    prompt = dg_prompt(21, 2)  # two chunks of 16 rows, 11 of them padding
    want = engine.generate(prompt, s, **kw).token_ids

    def padded_encode(tokens, arena, start=0):
        assert engine.encoder_graphs(arena).run(tokens, ENCODE_GRANULE, start)

    monkeypatch.setattr(engine, "_encode_prompt", padded_encode)
    assert engine.generate(prompt, s, **kw).token_ids == want
    assert chunks(32, ENCODE_GRANULE) == [(0, 16), (16, 16)]
