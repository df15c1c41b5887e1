"""ops/branches.py on the CPU: fork_join is the sequential code there (main, then side, on the
one stream), and `enabled` says two streams only for CUDA inference with the switch on and no
tensor parallelism. DiffusionGemma's two branches are independent (run in either order, the
same bits). GPU: tests/engine/test_branches_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from dg_helpers import VOCAB, ckpt  # noqa: F401

from dlmrt import envs
from dlmrt.attention import AttnContext
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.ops import branches, choices
from dlmrt.parallel import group as tp

CUDA_LIKE = SimpleNamespace(device=torch.device("cuda", 0))  # what `enabled` reads of a tensor


def test_cpu_runs_main_then_side_on_the_current_stream():
    order = []
    x = torch.arange(4.0)

    def main():
        order.append("main")
        return x * 2

    def side():
        order.append("side")
        return (x + 1, [x - 1])

    with torch.no_grad():
        a, (b, (c,)) = branches.fork_join(main, side, x)
    assert order == ["main", "side"] and not branches.enabled(x)
    assert a.tolist() == [0, 2, 4, 6] and b.tolist() == [1, 2, 3, 4] and c.tolist() == [-1, 0, 1, 2]


def test_two_streams_only_for_cuda_inference(monkeypatch):
    monkeypatch.delenv("DLMRT_BRANCH_STREAMS", raising=False)
    with torch.no_grad():
        assert branches.enabled(CUDA_LIKE)
        assert not branches.enabled(torch.zeros(1))  # the CPU
        monkeypatch.setenv("DLMRT_BRANCH_STREAMS", "0")
        assert not branches.enabled(CUDA_LIKE)
        monkeypatch.setenv("DLMRT_BRANCH_STREAMS", "1")
        assert branches.enabled(CUDA_LIKE)
    with torch.inference_mode():
        assert branches.enabled(CUDA_LIKE)
    with torch.enable_grad():
        assert not branches.enabled(CUDA_LIKE)  # training: sequential
    assert choices.get("branch_streams").line() == "branch_streams: two streams (CUDA inference)"
    monkeypatch.setenv("DLMRT_BRANCH_STREAMS", "0")
    with torch.inference_mode():
        branches.enabled(CUDA_LIKE)
    assert choices.get("branch_streams").line() == (
        "branch_streams: one stream (DLMRT_BRANCH_STREAMS=0)"
    )


def test_tensor_parallelism_runs_sequentially():
    group = tp.TPGroup(rank=0, world=2, device=torch.device("cuda", 0))
    tp.set_active(group)
    try:
        with torch.no_grad():
            assert not branches.enabled(CUDA_LIKE)
        assert choices.get("branch_streams").why == "tensor parallel"
    finally:
        tp.set_active(None)
    with torch.no_grad():
        assert branches.enabled(CUDA_LIKE)


def test_the_switch_rejects_other_values(monkeypatch):
    monkeypatch.setenv("DLMRT_BRANCH_STREAMS", "yes")
    with pytest.raises(ValueError, match="DLMRT_BRANCH_STREAMS='yes'"):
        envs.branch_streams()


def test_diffusion_gemma_branches_are_independent(ckpt, monkeypatch):  # noqa: F811
    """Every layer forks its dense MLP and its router + experts once; running the expert branch
    first gives the same logits bit for bit (neither branch reads what the other writes)."""
    model = load_checkpoint(ckpt[0], torch.float32, torch.device("cpu")).model
    ids = torch.randint(3, VOCAB, (11,), generator=torch.Generator().manual_seed(3))
    ctx = AttnContext(torch.arange(11), block_size=1)
    with torch.no_grad():
        plain = model(ids, ctx, canvas=8)
    calls = []

    def side_first(main, side, like):
        calls.append(like.shape)
        b = side()
        return main(), b

    monkeypatch.setattr(branches, "fork_join", side_first)
    with torch.no_grad():
        swapped = model(ids, ctx, canvas=8)
    assert calls == [torch.Size([11, model.cfg.hidden_size])] * model.cfg.num_hidden_layers
    assert torch.equal(plain, swapped)


def test_the_side_stream_is_never_the_current_one(monkeypatch):
    """PyTorch's stream pool is round-robin: should it hand the side stream out again as a later
    capture stream, the next fork draws another side stream (else the branches would serialise)."""
    pool = iter(["s0", "s1", "s2", "s3"])
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: next(pool))
    monkeypatch.setattr(branches, "_SIDE", {})
    gpu = torch.device("cuda", 0)
    assert branches.side_stream(gpu, "main") == "s0"
    assert branches.side_stream(gpu, "main") == "s0"  # drawn once
    assert branches.side_stream(gpu, "s0") == "s1"  # s0 came back as the current stream
    assert branches.side_stream(gpu, "s2") == "s1"
