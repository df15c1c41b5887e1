"""GPU: prefix reuse in every mode decodes a conversation as cold requests do (fp32), reuses the
same rows in every mode, and a prefill that starts at a reused boundary runs its chunks from there.

Run on the device machine: pytest -m gpu. bf16 is not compared token for token here: a reused
block's K/V come from a joint pass of 2B rows, a cold request's from a prefill chunk, and cuBLAS
may round those GEMMs differently (docs/prefix-reuse.md, "Exactness").
"""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM
from dlmrt.engine.graph import prefill

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
KW = dict(max_new_tokens=24, ignore_eos=True)


def _ids(n: int, salt: int = 0) -> list[int]:
    return [(37 * i + 11 + salt) % 200 + 3 for i in range(n)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix-gpu")
    return {
        "qwen-orl": write_checkpoint(root / "q", residual=residual_config()),
        "llada2": write_llada2_checkpoint(root / "l", seed=1),
    }


def _conversation(llm: LLM, cold: LLM, turns: list[list[int]]):
    """Both engines answer the same prompts (each built from the cold engine's answers); after
    each turn the prompt's whole blocks (reused or prefilled) hold the same K/V in both arenas,
    up to kernel rounding. Returns per turn: (reused tokens, cold tokens), and the reused engine's cached tokens."""
    ids, tokens, cached = [], [], []
    for new in turns:
        ids = ids + new
        out, ref = llm.generate(ids, **KW), cold.generate(ids, **KW)
        assert ref.num_cached_tokens == 0
        a, c = llm.engine.workspace.arena, cold.engine.workspace.arena
        block = llm.style.cfg.block_size
        rows = len(ids) // block * block  # the prompt's whole blocks: reused or prefilled here,
        assert out.num_cached_tokens <= rows  # all prefilled there
        for mine, theirs in ((a.k, c.k), (a.v, c.v)):
            torch.testing.assert_close(mine[:, :, :rows], theirs[:, :, :rows], rtol=1e-4, atol=1e-4)
        tokens.append((out.token_ids, ref.token_ids))
        cached.append(out.num_cached_tokens)
        ids = ids + ref.token_ids
    return tokens, cached


@pytest.mark.parametrize("max_rows", [2048, 24])  # 24: chunks of three blocks from the boundary
@pytest.mark.parametrize("name", ["qwen-orl", "llada2"])
def test_every_mode_reuses_the_same_rows_and_decodes_as_cold(
    checkpoints, name, max_rows, monkeypatch
):
    """Reuse is exact up to kernel rounding: the reused rows' K/V equal a cold prefill's to 1e-4
    (fp32). Tokens: the first turn (nothing reused) as cold's; a later turn's may differ from
    cold's where two logits are within that rounding of each other (docs/prefix-reuse.md,
    "Exactness"), so they are compared between the modes, which run the same kernels."""
    monkeypatch.setattr(prefill, "MAX_GRAPH_ROWS", max_rows)
    turns = [_ids(21), _ids(9, 1), _ids(30, 2)]
    cached, tokens = {}, {}
    for mode in MODES:
        llm = LLM(checkpoints[name], device="cuda", dtype="float32", mode=mode)
        cold = LLM(checkpoints[name], device="cuda", dtype="float32", mode=mode, prefix_reuse=False)
        assert llm.mode == mode
        tokens[mode], cached[mode] = _conversation(llm, cold, turns)
        assert tokens[mode][0][0] == tokens[mode][0][1], mode
        assert cached[mode][0] == 0 and min(cached[mode][1:]) > 0
    assert cached["round_graph"] == cached["block_graph"] == cached["eager"]
    assert tokens["round_graph"] == tokens["block_graph"] == tokens["eager"]
