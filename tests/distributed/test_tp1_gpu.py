"""GPU, one device: the distributed code path on a one-rank NCCL group (vocab-parallel head and
statistics, all-reduce hooks, sliced loading, shared requests) decodes the plain path's tokens, in
every execution mode: round_graph and block_graph capture the NCCL collectives in their graphs.

Run on the device machine: pytest -m gpu tests/distributed/test_tp1_gpu.py
(`LLM` under torchrun caps graph modes at round_graph: `dlmrt/distributed/setup.py`; the
block_graph case here is the evidence for lifting that cap.)
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
