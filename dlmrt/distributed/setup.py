"""Join torchrun's group and shard a loaded model: what `LLM` calls (`dlmrt/llm.py`)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from dlmrt import capture_guard, envs
from dlmrt.config import BLOCK_GRAPH, EAGER, ROUND_GRAPH, EngineConfig
from dlmrt.parallel.group import TPGroup, init_from_env, launched_world_size
from dlmrt.parallel.linear import ShardError, split

log = logging.getLogger("dlmrt")


def join(config: EngineConfig) -> tuple[EngineConfig, TPGroup | None]:
    """(config on this rank's device, the group) or (config, None) when not tensor parallel."""
    procs = None
    if (config.tensor_parallel_size or 1) > 1 and launched_world_size() == 1:
        from dlmrt.distributed.spawn import spawn_followers
        from dlmrt.loading.checkpoint import resolve_model_path

        if config.model is not None:  # a bad path or an unshardable model: named here, at once
            check_shardable(resolve_model_path(config.model), config.tensor_parallel_size)
        procs = spawn_followers(config)  # no torchrun: this process is rank 0 of its own group
    group = init_from_env(config.tensor_parallel_size, config.torch_device(), envs.tp_timeout_s())
    if group is None:
        return config, None
    if procs is not None:
        from dlmrt.distributed.spawn import release_at_exit

        release_at_exit(group, procs)
    if config.quantization == "fp8":  # FP8 scales are not sliced with their weights yet
        raise ValueError("quantization: 'fp8' is not supported with tensor parallelism yet")
    if group.is_root:
        log.info("tensor parallel: %d ranks, device %s", group.world, group.device)
    return replace(config, device=str(group.device)), group


def check_shardable(root: Path, world: int) -> None:
    """Before any rank starts: the sizes sharding splits (attention heads, KV heads, MLP and
    expert widths in config.json, or its `text_config`) must split over `world` ranks; else the
    ShardError each rank would raise after loading, raised once and at once."""
    from dlmrt.json_file import read_json

    raw = read_json(root / "config.json", required=False) or {}
    cfg = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if isinstance(heads, int) and heads > 0:
        split(heads, world, "num_attention_heads")
    if isinstance(kv, int) and kv > 0 and (kv >= world and kv % world or kv < world and world % kv):
        raise ShardError(
            f"tensor parallel: num_key_value_heads = {kv} does not split over (or "
            f"divide) the world size {world}"
        )
    for name in ("intermediate_size", "moe_intermediate_size"):
        if isinstance(cfg.get(name), int) and cfg[name] > 0:
            split(cfg[name], world, name)


def loader(group: TPGroup | None):
    """The `shard` hook of `load_checkpoint`: each rank reads only its slices (None: plain)."""
    if group is None:
        return None
    from dlmrt.distributed.loading import sliced_loader

    return sliced_loader(group)


_LEVEL = {EAGER: 0, ROUND_GRAPH: 1, BLOCK_GRAPH: 2}


def _collective_capture_self_test(group: TPGroup) -> None:
    """Capture an all-reduce in a CUDA graph and replay it twice (NCCL capture support)."""
    x = torch.ones(4, device=group.device)
    group.all_reduce(x)  # warm-up outside the graph (NCCL initialises its communicator)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with capture_guard.graph(graph, stream=stream):
        group.all_reduce(x)
    x.fill_(1.0)
    graph.replay()
    graph.replay()
    if x.sum().item() != 4 * group.world**2:
        raise RuntimeError("an all-reduce captured in a CUDA graph replayed wrongly")


def _while_collective_self_test(group: TPGroup) -> None:
    """A WHILE graph whose body all-reduces: 3 rounds, x = 1 -> world^3 on every rank. Every rank
    runs the same number of rounds (the condition reads device state the all-reduce made equal),
    which is what the block graph's collectives rely on."""
    from dlmrt.engine.graph.while_graph import self_test

    x = torch.ones(4, device=group.device)
    group.all_reduce(x)  # warm-up outside the graph
    x.fill_(1.0)  # capturing runs nothing: the launch starts from these ones
    self_test(lambda: group.all_reduce(x), group.device)  # raises unless exactly 3 rounds ran
    if x.sum().item() != 4 * group.world**3:
        raise RuntimeError(
            f"a WHILE body with an all-reduce summed to {x.sum().item()} "
            f"(want {4 * group.world**3})"
        )


def agree_mode(mode: str, reason: str, group: TPGroup | None) -> tuple[str, str]:
    """One execution mode for every rank: block_graph if a WHILE body with an all-reduce passes
    its self-test, else round_graph if a captured all-reduce does, else eager; then the lowest
    rank's choice (every rank must launch the same graphs)."""
    if group is None:
        return mode, reason
    if mode == BLOCK_GRAPH:
        try:
            _while_collective_self_test(group)
        except Exception as e:  # any failure of the fast path means: fall back, say why
            why = f"tensor parallel: WHILE body with collectives failed ({e})"
            mode, reason = ROUND_GRAPH, why
    if mode == ROUND_GRAPH:
        try:
            _collective_capture_self_test(group)
        except Exception as e:  # any failure of the fast path means: fall back, say why
            mode, reason = EAGER, f"tensor parallel: all-reduce capture failed ({e})"
    level = torch.tensor([_LEVEL[mode]], dtype=torch.long)
    torch.distributed.all_reduce(level, torch.distributed.ReduceOp.MIN, group=group.control)
    agreed = next(m for m, v in _LEVEL.items() if v == int(level))
    if agreed != mode:
        reason = f"another rank could only run {agreed}"
    return agreed, reason
