"""GPU: independent branches on two CUDA streams (`dlmrt/ops/branches.py`). The join orders the
side branch before its reader; a captured fork/join replays identically; DiffusionGemma with its
router + experts on the second stream: eager == round_graph == block_graph token for token (bf16
tiny and mid, FP8 mid), the same tokens as the one-stream path (DLMRT_BRANCH_STREAMS=0), and the
two-stream block_graph canvas replays bit for bit 100 times, equal to the one-stream graph's.

Run on the device machine: pytest -m gpu tests/engine/test_branches_gpu.py
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import assert_modes_agree
from dg_helpers import F_, SETTINGS, S, _prompt, ckpt, mid_checkpoint  # noqa: F401

from dlmrt import LLM
from dlmrt.engine.encoder_decoder.step import begin
from dlmrt.engine.graph.capture import capture
from dlmrt.ops import branches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
FP8_ENV = dict(DLMRT_FP8_GEMMS="all", DLMRT_FP8_GEMM_KERNEL="triton", DLMRT_FP8_EXPERTS="w8a8")
CASES = {"tiny": [(3, 20), (13, 40)], "mid": [(5, 40), (40, 64)], "mid-fp8": [(5, 40), (40, 64)]}


@pytest.fixture(scope="module")
def checkpoints(ckpt, tmp_path_factory):  # noqa: F811
    """The tiny checkpoint, and a 3-layer mid-size one (the FP8 kernels' widths)."""
    mid = mid_checkpoint(tmp_path_factory, [S, S, F_])
    return {"tiny": ckpt[0], "mid": mid, "mid-fp8": mid}


@pytest.fixture
def side_streams(monkeypatch):
    """Whether each side branch ran on a stream other than its caller's (True per call)."""
    seen: list[bool] = []
    real = branches.fork_join

    def spy(main, side, like):
        here = torch.cuda.current_stream()

        def traced():
            seen.append(torch.cuda.current_stream() != here)
            return side()

        return real(main, traced, like)

    monkeypatch.setattr(branches, "fork_join", spy)
    return seen


def _llms(path, name: str, monkeypatch, streams: str) -> dict[str, LLM]:
    monkeypatch.setenv("DLMRT_BRANCH_STREAMS", streams)
    quant = None
    if name.endswith("fp8"):
        quant = "fp8"
        for k, v in FP8_ENV.items():
            monkeypatch.setenv(k, v)
    return {m: LLM(path, device="cuda", mode=m, quantization=quant) for m in MODES}


def _generate(llms: dict[str, LLM], name: str, k: int) -> list[dict]:
    return [
        {
            m: llm.generate(
                _prompt(plen, seed), max_new_tokens=max_new, seed=seed, rng="counter", **SETTINGS[k]
            )
            for m, llm in llms.items()
        }
        for seed, (plen, max_new) in enumerate(CASES[name])
    ]


def test_the_join_waits_for_the_side_branch():
    x = torch.ones(1 << 20, device="cuda")

    def side():
        torch.cuda._sleep(100_000_000)  # tens of ms: without the join, the sum reads early
        return x * 3

    with torch.inference_mode():
        assert branches.enabled(x)
        a, b = branches.fork_join(lambda: x * 2, side, x)
        total = (a + b).sum()
    assert total.item() == 5 * x.numel()


def test_a_captured_fork_join_replays_100_times(monkeypatch):
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w1, w2, w3 = (torch.randn(256, 256, device="cuda", generator=g) for _ in range(4))
    out = torch.empty(256, 256, device="cuda")

    def slow(y):
        torch.cuda._sleep(1_000_000)
        return y @ w2

    def step():
        a, b = branches.fork_join(lambda: torch.relu(x @ w1), lambda: slow(x), x)
        out.copy_(a @ w3 + b)

    with torch.inference_mode():
        monkeypatch.setenv("DLMRT_BRANCH_STREAMS", "0")
        step()
        expected = out.clone()
        monkeypatch.setenv("DLMRT_BRANCH_STREAMS", "1")
        graph = capture(step, torch.cuda.Stream(), torch.cuda.graph_pool_handle())
        for _ in range(100):
            out.zero_()
            graph.replay()
            assert torch.equal(out, expected)


@pytest.mark.parametrize("name", ["tiny", "mid", "mid-fp8"])
def test_modes_agree_and_equal_one_stream(checkpoints, monkeypatch, side_streams, name):
    one = [_generate(_llms(checkpoints[name], name, monkeypatch, "0"), name, k) for k in (0, 2)]
    assert side_streams and not any(side_streams)
    side_streams.clear()
    two = [_generate(_llms(checkpoints[name], name, monkeypatch, "1"), name, k) for k in (0, 2)]
    assert side_streams and all(side_streams)  # eager, warm-ups and captures: the second stream
    for k, (runs_one, runs_two) in enumerate(zip(one, two, strict=True)):
        for seed, (outs_one, outs_two) in enumerate(zip(runs_one, runs_two, strict=True)):
            assert_modes_agree(outs_two, name, k, seed, "two streams")
            for m in MODES:
                assert outs_two[m].token_ids == outs_one[m].token_ids, (name, m, k, seed)
                assert outs_two[m].rounds_per_block == outs_one[m].rounds_per_block


def _canvas_runs(llm: LLM, times: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Run one canvas's steps (block_graph: one WHILE-graph launch) `times` times from the same
    start; each run's (self-conditioning probabilities, argmax, steps)."""
    engine = llm.engine
    # 12 steps every time: a stability run of 12 cannot be met before the 12-step cap
    settings = replace(llm.canvas_settings, max_denoising_steps=12, stability_threshold=12)
    prog = engine.program(settings, 2 * engine.canvas_length)
    runs = []
    with torch.inference_mode():
        for _ in range(times):
            begin(prog.spec, prog.buf, 0, 7)
            prog.runner.run(prog.steps)
            buf = prog.buf
            runs.append((buf.sc.clone(), buf.argmax.clone(), int(buf.step)))
    return runs


@pytest.mark.parametrize("name", ["tiny", "mid-fp8"])
def test_two_stream_graph_replays_identically_100_times(checkpoints, monkeypatch, name):
    quant = "fp8" if name.endswith("fp8") else None
    if quant:
        for k, v in FP8_ENV.items():
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("DLMRT_BRANCH_STREAMS", "0")  # read at capture: the one-stream graph
    ref = _canvas_runs(LLM(checkpoints[name], device="cuda", quantization=quant), 1)[0]
    monkeypatch.setenv("DLMRT_BRANCH_STREAMS", "1")
    llm = LLM(checkpoints[name], device="cuda", quantization=quant)
    assert llm.mode == "block_graph"
    runs = _canvas_runs(llm, 100)
    assert ref[2] == 12  # the self-conditioning feedback is in the loop
    for sc, argmax, steps in runs:
        assert torch.equal(sc, ref[0]) and torch.equal(argmax, ref[1]) and steps == ref[2]
