"""The sharded code path on one rank decodes the plain path's tokens; bad world sizes are named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint
from tp_helpers import generate_sharded, one_rank_group, sharded_llm

from dlmrt import LLM
from dlmrt.distributed.loading import sliced_loader
from dlmrt.distributed.shard import shard_model
from dlmrt.errors import CheckpointError
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.parallel.group import TPGroup
from dlmrt.parallel.linear import ShardError, VocabParallelEmbedding

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def group() -> TPGroup:
    return one_rank_group(CPU)


@pytest.mark.parametrize("kind", ["base", "orl", "llada_orl"])
def test_one_rank_sharded_path_decodes_the_plain_tokens(tmp_path: Path, group, kind: str):
    if kind == "llada_orl":
        path = write_llada2_checkpoint(tmp_path / kind, residual=residual_config())
    else:
        path = write_checkpoint(
            tmp_path / kind, residual=residual_config() if kind == "orl" else None
        )
    plain, tp = LLM(path, mode="eager"), sharded_llm(path, group, torch.float32)
    assert isinstance(tp.model.model.get_submodule(tp.model.EMBED), VocabParallelEmbedding)
    for kw in (dict(), dict(temperature=0.8, seed=1)):
        want = plain.generate(PROMPT, max_new_tokens=16, ignore_eos=True, **kw)
        got = generate_sharded(tp, group, PROMPT, max_new_tokens=16, ignore_eos=True, **kw)
        assert got.token_ids == want.token_ids, kw
        assert got.rounds_per_block == want.rounds_per_block, kw


def _model(path: Path):
    return load_checkpoint(path, torch.float32, CPU).model


@pytest.mark.parametrize(
    "overrides, world, named",
    [
        (dict(), 3, "num_attention_heads = 4 is not divisible by the world size 3"),
        (dict(num_attention_heads=6, num_key_value_heads=2), 3, "num_key_value_heads = 2"),
        (dict(intermediate_size=90), 4, "intermediate size of model.layers.0.mlp = 90"),
        (dict(vocab_size=262), 4, "vocab_size = 262 is not divisible by the world size 4"),
    ],
)
def test_a_world_size_that_does_not_divide_names_the_dimension(tmp_path, overrides, world, named):
    path = write_checkpoint(tmp_path / "m", tokenizer=False, **overrides)
    fake = TPGroup(0, world, CPU)  # the error comes before any collective
    with pytest.raises(ShardError, match=named):
        shard_model(_model(path), fake)


def test_fewer_kv_heads_than_ranks_replicates_the_kv_head_of_each_rank(tmp_path):
    path = write_checkpoint(tmp_path / "m", tokenizer=False)  # 4 q heads, 2 kv heads
    full = _model(path).model.layers[0].self_attn
    for rank in range(4):
        attn = shard_model(_model(path), TPGroup(rank, 4, CPU)).model.layers[0].self_attn
        assert (attn.heads, attn.kv_heads) == (1, 1)
        kv = rank // 2  # q head `rank` reads kv head rank // (4 / 2)
        torch.testing.assert_close(attn.k_proj.weight, full.k_proj.weight[kv * 16 : (kv + 1) * 16])
        torch.testing.assert_close(
            attn.q_proj.weight, full.q_proj.weight[rank * 16 : (rank + 1) * 16]
        )
        torch.testing.assert_close(
            attn.o_proj.weight, full.o_proj.weight[:, rank * 16 : (rank + 1) * 16]
        )


def _sliced_equals_sharded_after_loading(path: Path, world: int) -> None:
    for rank in range(world):
        group = TPGroup(rank, world, CPU)
        after = shard_model(_model(path), group).state_dict()
        sliced = load_checkpoint(path, torch.float32, CPU, shard=sliced_loader(group)).model
        got = sliced.state_dict()
        assert got.keys() == after.keys()
        for name, value in after.items():
            assert torch.equal(got[name], value), (rank, name)


@pytest.mark.parametrize("kind", ["qwen_tied", "llada_orl"])
def test_sliced_loading_reads_the_slices_of_sharding_after_loading(tmp_path, kind):
    if kind == "llada_orl":  # fused query_key_value, stacked experts, shared expert, adapter
        path = write_llada2_checkpoint(tmp_path / kind, residual=residual_config())
    else:
        path = write_checkpoint(tmp_path / kind, tokenizer=False, tie_word_embeddings=True)
    _sliced_equals_sharded_after_loading(path, 2)


def test_sliced_loading_of_diffusion_gemma(tmp_path_factory):
    from dg_helpers import tiny_checkpoint

    path, _ = tiny_checkpoint(tmp_path_factory)  # gate|up experts, K = V layers, 1 global kv head
    _sliced_equals_sharded_after_loading(path, 2)


ROOT = Path(__file__).resolve().parents[2]
SPAWNED = """
import json, sys
from dlmrt import LLM
llm = LLM(sys.argv[1], tensor_parallel_size=2, device="cpu", dtype="float32")
outs = [llm.generate(PROMPT, max_new_tokens=20, ignore_eos=True, **kw).token_ids
        for kw in ({}, {"temperature": 0.8, "seed": 2})]
print(json.dumps({"tokens": outs, "lm_head_rows": llm.model.lm_head.weight.shape[0]}))
"""


@pytest.mark.slow
def test_tensor_parallel_without_torchrun_spawns_the_ranks(tmp_path, monkeypatch):
    """`LLM(DIR, tensor_parallel_size=2)` in a plain process: it starts rank 1 itself, decodes the
    one-process tokens with half the vocabulary per rank, and exits cleanly (followers released)."""
    import json
    import subprocess
    import sys

    path = write_checkpoint(tmp_path / "m")
    prompt = [(37 * i + 11) % 256 for i in range(13)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DLMRT_TP_TIMEOUT_S="30")
    script = SPAWNED.replace("PROMPT", repr(prompt))
    res = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    plain = LLM(path, device="cpu", dtype="float32")
    want = [
        plain.generate(prompt, max_new_tokens=20, ignore_eos=True, **kw).token_ids
        for kw in ({}, {"temperature": 0.8, "seed": 2})
    ]
    assert got["tokens"] == want
    assert got["lm_head_rows"] == plain.model.lm_head.weight.shape[0] // 2


def test_tensor_parallel_size_errors_start_no_process(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    path = write_checkpoint(tmp_path / "m")
    with pytest.raises(ValueError, match="tensor_parallel_size: must be >= 1"):
        LLM(path, tensor_parallel_size=0)
    with pytest.raises(CheckpointError, match="does not exist"):
        LLM(str(tmp_path / "missing"), tensor_parallel_size=2)
    assert "WORLD_SIZE" not in os.environ  # nothing was spawned for a bad path
    # 3 ranks over 4 attention heads: named at once, before any rank starts (not after loading)
    with pytest.raises(ValueError, match="num_attention_heads = 4 is not divisible by the world"):
        LLM(path, tensor_parallel_size=3)
    assert "WORLD_SIZE" not in os.environ


def test_tp_flag_is_an_alias_of_tensor_parallel_size():
    from dlmrt.cli import build_parser

    args = build_parser().parse_args(["generate", "--tp", "2", "x"])
    assert args.tensor_parallel_size == 2
    args = build_parser().parse_args(["serve", "--tensor-parallel-size", "4"])
    assert args.tensor_parallel_size == 4


def test_one_rank_sharded_diffusion_gemma_decodes_the_plain_tokens(tmp_path_factory, group):
    from dg_helpers import tiny_checkpoint

    path, _ = tiny_checkpoint(tmp_path_factory)
    plain, tp = LLM(path, mode="eager"), sharded_llm(path, group, torch.float32)
    assert isinstance(tp.model.model.embed_tokens, VocabParallelEmbedding)
    for seed in (0, 3):
        kw = dict(max_new_tokens=16, rng="counter", seed=seed)
        want = plain.generate([7, 30, 55, 12, 90, 41], **kw)
        got = generate_sharded(tp, group, [7, 30, 55, 12, 90, 41], **kw)
        assert got.token_ids == want.token_ids, seed
    with pytest.raises(ValueError, match="rng: 'torch' is not supported under tensor"):
        generate_sharded(tp, group, [7, 30], max_new_tokens=8, rng="torch")


KILLED = """
import os, sys
import dlmrt.distributed.spawn as spawn
from dlmrt import LLM
real = spawn.spawn_followers
def spy(config):
    procs = real(config)
    print(" ".join(str(p.pid) for p in procs), flush=True)
    return procs
spawn.spawn_followers = spy
LLM(sys.argv[1], tensor_parallel_size=2, device="cpu", dtype="float32")
os.kill(os.getpid(), 9)
"""


@pytest.mark.slow
def test_a_spawned_follower_does_not_outlive_a_killed_rank_0(tmp_path):
    import subprocess
    import sys
    import time

    path = write_checkpoint(tmp_path / "m")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DLMRT_TP_TIMEOUT_S="30")
    res = subprocess.run(
        [sys.executable, "-c", KILLED, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == -9, res.stderr[-2000:]
    pid = int(res.stdout.split()[0])

    def alive() -> bool:  # a zombie (exited, not yet reaped by init) counts as gone
        try:
            return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(), f"follower {pid} still running after rank 0 was killed"
