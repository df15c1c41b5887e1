"""Execution-mode selection on a machine without CUDA, and the counter-based sampling noise."""

from __future__ import annotations

import logging

import pytest
import torch

from dlmrt import LLM
from dlmrt.decoding.noise import counter_uniform
from dlmrt.engine.graph.modes import select_mode

CPU = torch.device("cpu")


def test_auto_falls_back_to_eager_on_cpu_with_reason():
    """auto on a CPU device gives eager and says why."""
    mode, reason = select_mode("auto", CPU)
    assert mode == "eager" and "cpu" in reason


@pytest.mark.parametrize("mode", ["block_graph", "round_graph"])
def test_forced_graph_mode_on_cpu_is_a_clear_error(mode):
    """Forcing a graph mode without CUDA raises ValueError naming `mode`."""
    with pytest.raises(ValueError, match=f"mode: {mode} needs a CUDA device"):
        select_mode(mode, CPU)


def test_unknown_mode_names_the_field():
    with pytest.raises(ValueError, match="mode: expected one of"):
        select_mode("warp", CPU)


def test_llm_logs_the_chosen_mode(base_ckpt, caplog):
    """LLM(...) logs the mode and the reason; outputs report the mode that ran."""
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        llm = LLM(base_ckpt, device="cpu")
    assert llm.mode == "eager"
    assert any("execution mode eager" in r.getMessage() for r in caplog.records)
    assert llm.generate("hi", max_new_tokens=4).mode == "eager"


def test_counter_noise_is_a_pure_function_of_its_counters():
    """Same (seed, block, round) -> same uniforms; any counter changed -> different uniforms."""
    t = torch.tensor
    a = counter_uniform(t(5), t(256), t(3), 64)
    assert torch.equal(a, counter_uniform(t(5), t(256), t(3), 64))
    for other in (
        counter_uniform(t(6), t(256), t(3), 64),
        counter_uniform(t(5), t(512), t(3), 64),
        counter_uniform(t(5), t(256), t(4), 64),
    ):
        assert (a != other).float().mean() > 0.9
    assert a.dtype == torch.float32 and bool(((a >= 0) & (a < 1)).all())


def test_counter_noise_is_uniform():
    """Mean, variance and the histogram of 2^18 draws match U[0, 1)."""
    u = counter_uniform(torch.tensor(1), torch.tensor(0), torch.tensor(0), 1 << 18)
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    hist = torch.histc(u, bins=16, min=0, max=1) / u.numel()
    assert (hist - 1 / 16).abs().max() < 0.003


def test_moe_models_fall_back_to_eager_when_the_moe_ops_are_the_twins(monkeypatch):
    """The MoE twins sync with the host: with them, auto gives eager (with why) even where a graph
    mode would pass its self-test, a forced graph mode is an error naming the mode, and dense
    models are unaffected."""
    from dlmrt import ops
    from dlmrt.engine.graph import modes

    monkeypatch.setattr(modes, "_select", lambda requested, device: ("block_graph", "ok"))
    ops.use("torch")
    try:
        mode, reason = select_mode("auto", CPU, moe=True)
        assert mode == "eager" and "torch twins" in reason
        with pytest.raises(ValueError, match="mode: round_graph needs the Triton MoE kernels"):
            select_mode("round_graph", CPU, moe=True)
        assert select_mode("auto", CPU) == ("block_graph", "ok")
        ops.use("triton")
        assert select_mode("auto", CPU, moe=True) == ("block_graph", "ok")
    finally:
        ops.use(None)


def test_runner_cache_keeps_the_most_recent_runners(tmp_path):
    """Per-request settings are graph constants, so each distinct value builds a runner: the
    cache keeps the MAX_RUNNERS most recently used ones (LRU) and rebuilds an evicted one with
    the same tokens."""
    from conftest import write_checkpoint

    from dlmrt.engine.graph.runner_cache import MAX_RUNNERS, RunnerCache

    cache = RunnerCache(2)
    assert cache.fetch("a", lambda: 1) == 1 and cache.fetch("b", lambda: 2) == 2
    assert cache.fetch("a", lambda: 0) == 1  # a hit: not rebuilt, now the most recent
    cache.fetch("c", lambda: 3)
    assert list(cache) == ["a", "c"]
    llm = LLM(write_checkpoint(tmp_path / "m"), device="cpu")
    first = llm.generate([5, 6, 7], max_new_tokens=9, threshold=0.5, ignore_eos=True)
    for i in range(MAX_RUNNERS + 2):
        llm.generate([5, 6, 7], max_new_tokens=9, threshold=0.6 + 0.05 * i, ignore_eos=True)
    assert len(llm.engine.workspace.programs) == MAX_RUNNERS
    again = llm.generate([5, 6, 7], max_new_tokens=9, threshold=0.5, ignore_eos=True)
    assert again.token_ids == first.token_ids
