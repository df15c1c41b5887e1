"""GPU: eager, round_graph and block_graph give the same tokens; graphs are reused; fallbacks work.

Run on the device machine: pytest -m gpu.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_modes_agree, residual_config, write_checkpoint

from dlmrt import LLM, reference
from dlmrt.decoding import make_rule
from dlmrt.decoding.noise import counter_uniform

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
KNOBS = {
    "threshold": {"threshold": 0.25},
    "entropy_budget": {"entropy_budget": 4.0},
    "fixed_steps": {"denoising_steps": 3},
}
MID = dict(
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
)


def _prompt(n: int) -> list[int]:
    return [(37 * i + 11) % 256 for i in range(n)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    return {
        "tiny-orl": write_checkpoint(root / "tiny-orl", residual=residual_config()),
        "tiny-base": write_checkpoint(root / "tiny-base"),
        "mid-orl": write_checkpoint(root / "mid-orl", residual=residual_config("block"), **MID),
    }


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["tiny-orl", "tiny-base", "mid-orl"])
def test_all_modes_give_the_same_tokens(checkpoints, name, dtype):
    """block_graph == round_graph == eager, token for token, over rules, prompts and sampling."""
    llms = {m: LLM(checkpoints[name], device="cuda", dtype=dtype, mode=m) for m in MODES}
    assert {m: llm.mode for m, llm in llms.items()} == {m: m for m in MODES}
    for rule, knob in KNOBS.items():
        for plen, temp in ((3, 0.0), (8, 0.0), (13, 0.8)):
            outs = {
                m: llm.generate(
                    _prompt(plen),
                    rule=rule,
                    max_new_tokens=29,
                    temperature=temp,
                    seed=plen,
                    ignore_eos=True,
                    **knob,
                )
                for m, llm in llms.items()
            }
            assert_modes_agree(outs, rule, plen)


def test_cuda_fp32_engine_matches_oracle(checkpoints):
    """fp32 on CUDA: the block graph and the no-cache oracle agree token for token."""
    llm = LLM(checkpoints["tiny-orl"], device="cuda", dtype="float32", mode="block_graph")
    for rule, knob in KNOBS.items():
        out = llm.generate(_prompt(13), rule=rule, max_new_tokens=40, ignore_eos=True, **knob)
        tokens, reason = reference.block.generate(
            llm.model,
            _prompt(13),
            rule=make_rule(rule, **knob),
            block_length=8,
            max_new_tokens=40,
            mask_id=llm.mask_id,
            stop_ids=llm.stop_ids,
            ignore_eos=True,
        )
        assert out.token_ids == tokens and out.finish_reason == reason


def test_graphs_are_captured_once_and_reused(checkpoints):
    """A second request with the same block length and rule reuses the captured graphs."""
    llm = LLM(checkpoints["tiny-orl"], device="cuda", mode="block_graph")
    first = llm.generate(_prompt(5), max_new_tokens=20, ignore_eos=True)
    (program,) = llm.engine.workspace.programs.values()
    graphs = dict(program.runner.graphs)
    # folded commits: no commit graph; each block one chain (engine/block/engine.py: _blocks)
    assert set(graphs) == {
        "chain:copy_in+start+rounds+report+copy_out",
        "chain:copy_in+start_after+fold+rounds+report+copy_out",
    }
    second = llm.generate(_prompt(5), max_new_tokens=20, ignore_eos=True)
    assert list(llm.engine.workspace.programs.values()) == [program]
    assert program.runner.graphs == graphs and first.token_ids == second.token_ids


@pytest.mark.parametrize("mode", ["round_graph", "block_graph"])
def test_recorder_in_graph_modes_equals_eager(checkpoints, mode):
    """The trace written inside the captured rounds gives the eager records, field for field."""
    ckpt = checkpoints["tiny-orl"]
    kw = dict(max_new_tokens=24, ignore_eos=True, temperature=0.7, seed=3)
    runs = {}
    for m in ("eager", mode):
        llm = LLM(ckpt, device="cuda", dtype="float32", mode=m)
        records = []
        plain = llm.generate(_prompt(5), **kw)
        out = llm.generate(_prompt(5), recorder=records.append, **kw)
        assert out.mode == m and out.token_ids == plain.token_ids
        assert len(records) == out.num_denoising_forwards
        runs[m] = records
    for a, b in zip(runs["eager"], runs[mode], strict=True):
        assert (a.block_index, a.round) == (b.block_index, b.round)
        for name in ("canvas", "unresolved", "accepted", "proposal", "canvas_after"):
            assert getattr(a, name).equal(getattr(b, name)), name
        for name in ("z", "entropy", "confidence"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-5)


def test_auto_mode_falls_back_when_the_while_self_test_fails(monkeypatch, checkpoints):
    """auto: a failing block_graph self-test gives round_graph, with the failure as the reason."""
    import dlmrt.engine.graph.modes as modes

    def broken():
        raise RuntimeError("no conditional nodes here")

    monkeypatch.setattr(modes, "_block_graph_self_test", broken)
    mode, reason = modes.select_mode("auto", torch.device("cuda"))
    assert mode == "round_graph" and "no conditional nodes here" in reason
    with pytest.raises(ValueError, match="mode: block_graph failed its self-test"):
        modes.select_mode("block_graph", torch.device("cuda"))


def test_auto_mode_picks_block_graph():
    from dlmrt.engine.graph.modes import select_mode

    assert select_mode("auto", torch.device("cuda"))[0] == "block_graph"


def test_counter_noise_is_identical_on_cpu_and_cuda():
    t = torch.tensor
    cpu = counter_uniform(t(9), t(512), t(7), 4096)
    cuda = counter_uniform(t(9, device="cuda"), t(512, device="cuda"), t(7, device="cuda"), 4096)
    assert torch.equal(cpu, cuda.cpu())


def test_cuda_default_dtype_is_bf16_and_generates(checkpoints):
    """On a GPU the default dtype is bfloat16 and auto picks block_graph."""
    llm = LLM(checkpoints["tiny-orl"])
    assert llm.device.type == "cuda" and llm.dtype == torch.bfloat16 and llm.mode == "block_graph"
    out = llm.generate("hello", max_new_tokens=33, ignore_eos=True)
    assert len(out.token_ids) == 33 and out.finish_reason == "length"
