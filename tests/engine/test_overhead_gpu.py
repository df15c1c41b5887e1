"""GPU: per-request host overhead (issue 23) changes no token and captures nothing unused.

- prefill graphs (per length bucket, padded) give eager's tokens in every mode, every family;
- no Triton autotuner benchmarks anything after warm-up, for prompt lengths never seen before;
- a graph runner captures only the graphs it replays.

Run on the device machine: pytest -m gpu tests/engine/test_overhead_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_modes_agree, residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
BLOCK = 4
# prefill of 5, 9, 17 blocks: buckets of 6, 12, 24 blocks (padded); 2 blocks: unpadded
PROMPTS = (9, 22, 38, 70)


def _prompt(n: int) -> list[int]:
    return [(37 * i + 11) % 256 for i in range(n)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("overhead")
    return {
        "qwen-orl": (write_checkpoint(root / "q", residual=residual_config()), "threshold"),
        "llada2": (write_llada2_checkpoint(root / "l"), "llada_editing"),
    }


def _generate(llm: LLM, n: int, rule: str):
    kw = {"threshold": 0.25} if rule == "threshold" else {}
    return llm.generate(
        _prompt(n), rule=rule, block_length=BLOCK, max_new_tokens=16, ignore_eos=True, **kw
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["qwen-orl", "llada2"])
def test_prefill_graphs_give_eager_tokens(checkpoints, name, dtype):
    path, rule = checkpoints[name]
    # prefix reuse off: the prompts share their first rows, and a reused prefix would shrink the
    # later prefills below the buckets this test names
    llms = {m: LLM(path, device="cuda", dtype=dtype, mode=m, prefix_reuse=False) for m in MODES}
    for n in PROMPTS:
        assert_modes_agree({m: _generate(llm, n, rule) for m, llm in llms.items()}, name, n)
    for mode in ("round_graph", "block_graph"):
        graphs = llms[mode].engine.workspace.extras["prefill"].graphs
        assert {rows for rows, _ in graphs} == {8, 24, 48, 96}  # every prefill was a replay
    # eager runs the same padded chunks (same shapes, same kernels), uncaptured
    assert not llms["eager"].engine.workspace.extras["prefill"].graphs


def test_no_autotuning_after_warm_up(checkpoints, monkeypatch):
    from triton.runtime.autotuner import Autotuner

    path, rule = checkpoints["qwen-orl"]
    llm = LLM(path, device="cuda", dtype="bfloat16", mode="block_graph")
    _generate(llm, 9, rule)  # warm-up
    calls = []
    real = Autotuner._bench
    monkeypatch.setattr(Autotuner, "_bench", lambda s, *a, **k: calls.append(1) or real(s, *a, **k))
    for n in (13, 30, 61, 130):  # prompt lengths (and arena row counts) never seen before
        _generate(llm, n, rule)
    assert not calls


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("mode", ["round_graph", "block_graph"])
def test_runner_captures_only_what_it_replays(checkpoints, mode, fold):
    path, rule = checkpoints["qwen-orl"]
    llm = LLM(path, device="cuda", mode=mode, fold_commits=fold)
    _generate(llm, 9, rule)
    (prog,) = llm.engine.workspace.programs.values()
    runner, replayed = prog.runner, set()
    if mode == "block_graph":  # a chain is one graph (a lone loop: its WHILE graph)
        chain = runner.chain

        def spy(parts, *a):
            names = [p.name for p in parts]
            one = len(names) == 1
            replayed.add("while:" + names[0] if one else "chain:" + "+".join(names))
            return chain(parts, *a)

        runner.chain = spy
    else:  # round_graph: one graph per program, whether run alone or in a chain
        run = runner.run
        runner.run = lambda loop, *a: replayed.add(loop.name) or run(loop, *a)
    once = runner.once
    runner.once = lambda p: replayed.add(p.name) or once(p)
    for n in (9, 22):
        _generate(llm, n, rule)
    assert set(runner.graphs) == replayed
    names = "+".join(replayed)
    assert ("fold" in names) == fold and ("commit" in names) != fold
    if mode == "block_graph":  # a block is one launch: copy in .. copy out
        assert any(k.startswith("chain:copy_in+") and k.endswith("+copy_out") for k in replayed)
