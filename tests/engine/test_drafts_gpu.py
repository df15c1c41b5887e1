"""GPU: a request's drafts are the same in eager, round_graph and block_graph, token for token
(block_graph hands a block's rounds over from the device-side trace after its single launch), for
QwenDLM's rules, LLaDA2's editing rule and DiffusionGemma's canvases (counter noise). The drafts
also replay to the output (`assert_replays`, the CPU test's check).

Run on the device machine: pytest -m gpu tests/engine/test_drafts_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint
from dg_helpers import _prompt, ckpt  # noqa: F401
from draft_checks import assert_replays

from dlmrt import LLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
PROMPT = [(37 * i + 11) % 256 for i in range(5)]
BLOCK_KNOBS = [
    {"rule": "threshold", "threshold": 0.25},
    {"rule": "entropy_budget", "entropy_budget": 4.0},
    {"rule": "fixed_steps", "denoising_steps": 3},
    {"rule": "entropy_budget", "temperature": 0.8, "seed": 5},
]


def _drafts_by_mode(path, dtype: str, prompt, **kw) -> dict:
    """mode -> (drafts, output) of one request; each mode's output equals its plain request's."""
    found = {}
    for mode in MODES:
        llm = LLM(path, device="cuda", dtype=dtype, mode=mode, fold_commits=False)
        drafts: list = []
        out = llm.generate(prompt, on_round=drafts.append, **kw)
        assert out.mode == mode
        assert out.token_ids == llm.generate(prompt, **kw).token_ids
        assert_replays(drafts, out, canvas=llm.family.style != "block")
        found[mode] = drafts, out
    return found


def _same(found: dict) -> None:
    ref, _ = found["eager"]
    for mode, (drafts, _) in found.items():
        assert [(d.block, d.round, d.tokens, d.states) for d in drafts] == [
            (d.block, d.round, d.tokens, d.states) for d in ref
        ], mode
        for a, b in zip(drafts, ref):  # the same kernels in every mode: equal up to fp noise
            assert torch.allclose(torch.tensor(a.confidence), torch.tensor(b.confidence), atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("knobs", BLOCK_KNOBS, ids=lambda k: "-".join(map(str, k.values())))
def test_qwen_drafts_agree_across_modes(tmp_path, knobs, dtype):
    path = write_checkpoint(tmp_path / "orl", residual=residual_config())
    _same(_drafts_by_mode(path, dtype, PROMPT, max_new_tokens=40, ignore_eos=True, **knobs))


@pytest.mark.parametrize("editing", ["quality", "speed"])
def test_llada_drafts_agree_across_modes(tmp_path, editing):
    path = write_llada2_checkpoint(tmp_path / "llada")
    found = _drafts_by_mode(path, "bfloat16", PROMPT, max_new_tokens=40, editing=editing)
    _same(found)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_canvas_drafts_agree_across_modes(ckpt, dtype):  # noqa: F811
    found = _drafts_by_mode(ckpt[0], dtype, _prompt(5, 0), max_new_tokens=30, rng="counter")
    _same(found)


def test_a_cap_of_one_round_or_step(tmp_path, ckpt):  # noqa: F811
    """block_length 1 (one round per block) and max_denoising_steps 1: the graph warm-ups run two
    bodies from round 0, past a one-row trace; they must stay in bounds (no device-side assert)."""
    path = write_checkpoint(tmp_path / "orl", residual=residual_config())
    _same(_drafts_by_mode(path, "float32", PROMPT, max_new_tokens=6, block_length=1))
    one_step = dict(max_new_tokens=20, rng="counter", max_denoising_steps=1)
    _same(_drafts_by_mode(ckpt[0], "float32", _prompt(5, 0), **one_step))
