"""DLMRT_CANVAS_ATTN on a DiffusionGemma in block_graph: the key-split canvas attention
(kernels/canvas_attention_split.py) gives the whole kernel's tokens. GPU only (the CPU runs the
torch twin whatever the pin; the kernels' own CPU tests: tests/ops/test_canvas_attention_split.py)."""

from __future__ import annotations

import pytest
import torch
from dg_helpers import F_, S, _prompt, ckpt, mid_checkpoint  # noqa: F401

from dlmrt.ops import canvas_launch, choices


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_block_graph_tokens_split_equals_whole(ckpt, tmp_path_factory, monkeypatch):  # noqa: F811
    """block_graph, fp32, the tiny model (its full layers, head dim 16, run the kernel; its
    sliding ones, head dim 8, the twin) and the mid-size one (head dims 32 and 64): the same
    tokens and finish with DLMRT_CANVAS_ATTN=whole and =split, the split launched with more than
    one key split on the full layers: MIN_TILES cut to one key tile per split, so the arenas of a
    60-token prompt and 48 new tokens (~120-160 rows, fp32's 32-key tiles) take 3-5 splits."""
    from dlmrt._kernels import canvas_attention_split

    from dlmrt import LLM

    monkeypatch.setattr(canvas_attention_split, "MIN_TILES", 1)
    paths = (ckpt[0], mid_checkpoint(tmp_path_factory, [S, F_, S]))
    for path in paths:
        outs = {}
        for pin in ("whole", "split"):
            monkeypatch.setenv("DLMRT_CANVAS_ATTN", pin)
            canvas_launch.forget()  # decided again on the next call, from the pin
            llm = LLM(path, device="cuda", dtype="float32", mode="block_graph")
            outs[pin] = [
                llm.generate(_prompt(60, seed), max_new_tokens=48, seed=seed, rng="counter")
                for seed in range(3)
            ]
            assert choices.get(canvas_launch.KERNEL_KEY).pick == pin
        launches = [c.pick for c in choices.recorded("canvas attention launch")]
        assert launches and any(p != "1 key splits" for p in launches), launches
        for a, b in zip(outs["whole"], outs["split"], strict=True):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
    canvas_launch.forget()
