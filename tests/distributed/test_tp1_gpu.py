"""GPU, one device: the distributed code path on a one-rank NCCL group (vocab-parallel head and
statistics, all-reduce hooks, sliced loading, shared requests) decodes the plain path's tokens, in
every execution mode: round_graph and block_graph capture the NCCL collectives in their graphs.

Run on the device machine: pytest -m gpu tests/distributed/test_tp1_gpu.py
(`LLM` under torchrun keeps block_graph only when `agree_mode`'s WHILE-body self-test passes:
`dlmrt/distributed/setup.py`; the block_graph case here decodes through collectives in the WHILE body.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint
from tp_helpers import generate_sharded, one_rank_group, sharded_llm

from dlmrt import LLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
PROMPT = [(37 * i + 11) % 256 for i in range(13)]


def _checkpoint(tmp_path: Path, kind: str) -> Path:
    if kind == "llada_orl":
        return write_llada2_checkpoint(tmp_path / kind, residual=residual_config())
    return write_checkpoint(tmp_path / kind, residual=residual_config() if kind == "orl" else None)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["base", "orl", "llada_orl"])
def test_tp1_distributed_path_equals_the_plain_path(tmp_path: Path, kind: str, mode: str):
    path = _checkpoint(tmp_path, kind)
    group = one_rank_group(torch.device("cuda"))
    plain = LLM(path, mode=mode, dtype="float32", device="cuda")
    tp = sharded_llm(path, group, torch.float32, mode=mode)
    for kw in (dict(), dict(temperature=0.8, seed=1)):
        want = plain.generate(PROMPT, max_new_tokens=40, ignore_eos=True, **kw)
        got = generate_sharded(tp, group, PROMPT, max_new_tokens=40, ignore_eos=True, **kw)
        assert got.mode == want.mode == mode
        assert got.token_ids == want.token_ids, kw
        assert got.rounds_per_block == want.rounds_per_block, kw


@pytest.mark.parametrize("mode", MODES)
def test_tp1_distributed_path_equals_the_plain_path_diffusion_gemma(tmp_path_factory, mode):
    from dg_helpers import tiny_checkpoint

    path, _ = tiny_checkpoint(tmp_path_factory)
    group = one_rank_group(torch.device("cuda"))
    plain = LLM(path, mode=mode, dtype="float32", device="cuda")
    tp = sharded_llm(path, group, torch.float32, mode=mode)
    prompt = [7, 30, 55, 12, 90, 41]
    for seed in (0, 3):
        kw = dict(max_new_tokens=24, rng="counter", seed=seed)
        want = plain.generate(prompt, **kw)
        got = generate_sharded(tp, group, prompt, **kw)
        assert got.mode == want.mode
        assert got.token_ids == want.token_ids, seed


def test_block_graph_self_test_passes_on_nccl():
    """`agree_mode` keeps block_graph when a WHILE body with an all-reduce replays rightly."""
    from dlmrt.distributed.setup import agree_mode

    group = one_rank_group(torch.device("cuda"))
    assert agree_mode("block_graph", "auto", group) == ("block_graph", "auto")
    assert agree_mode("round_graph", "forced", group) == ("round_graph", "forced")
