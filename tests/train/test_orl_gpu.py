"""ORL on CUDA (the device machine: pytest -m gpu tests/train/test_orl_gpu.py).

Graph-mode engines built on the live model see its updated weights; the staircase as a
flex_attention BlockMask == the dense mask (logits and gradients); replay exactness on CUDA; a
short bf16 + flex run of `train_orl`.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import residual_config, write_checkpoint
from orl_helpers import PROMPTS

from dlmrt import ops
from dlmrt.llm import LLM
from dlmrt.tokenizer import Tokenizer
from dlmrt.train.masks import block_mask, dense_mask
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.loop import train_orl
from dlmrt.train.orl.losses import LossSpec, combine, row_terms
from dlmrt.train.orl.plan import pack_docs, plan
from dlmrt.train.orl.replay import replay_logits
from dlmrt.train.orl.rollout import generate_rollouts
from dlmrt.train.orl.row import build_row
from dlmrt.train.orl.start import load_trainable

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _model(tmp_path):
    path = write_checkpoint(tmp_path / "orl", residual=residual_config())
    raw = json.loads((path / "config.json").read_text())
    return load_trainable(path, raw, CUDA, 0), path


def _gen(llm, **kw):
    return llm.generate("What is 12 + 3?", max_new_tokens=24, ignore_eos=True, **kw).token_ids


@pytest.mark.parametrize("mode", ["block_graph", "round_graph"])
def test_graph_modes_see_the_updated_weights(tmp_path, mode):
    model, path = _model(tmp_path)
    tok = Tokenizer(path)
    graph = LLM.from_model(model, tok, path=path, role="orl", mode=mode)
    before = _gen(graph)
    assert before == _gen(LLM.from_model(model, tok, path=path, role="orl", mode="eager"))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ids = torch.randint(0, 200, (16,), device=CUDA)
    from dlmrt.attention import AttnContext

    ops.use("torch")  # Triton kernels have no autograd
    try:
        loss = model(ids, AttnContext(torch.arange(16, device=CUDA), 8)).float().logsumexp(-1)
        loss.mean().backward()
    finally:
        ops.use(None)
    opt.step()  # in place: the captured graphs read the same storage
    after = _gen(graph)
    eager = _gen(LLM.from_model(model, tok, path=path, role="orl", mode="eager"))
    assert after == eager and after != before
    rec = []
    _gen(graph, recorder=rec.append)  # a recorder: the states of the current weights
    assert rec and rec[0].canvas.is_cuda


def _rows(model, path):
    llm = LLM.from_model(model, Tokenizer(path), path=path, role="orl", mode="eager")
    cfg = ORLConfig(model=str(path), rollouts_per_prompt=2, max_new_tokens=24, verifier_workers=0)
    rs = generate_rollouts(llm, PROMPTS, cfg, 0, tap_first=True)
    for r in rs:
        r.verified = True
    p = plan(rs, 0.25, None, model.cfg.vocab_size)
    return rs, p, [build_row(d, model.cfg.vocab_size, CUDA, 128) for d in pack_docs(p.docs, 512)]


def test_flex_block_mask_equals_the_dense_mask(tmp_path):
    model, path = _model(tmp_path)
    _, p, rows = _rows(model, path)
    spec = LossSpec(1.0, 0.2, 1.0, False, 0.1, 5.0)
    out = {}
    ops.use("torch")  # Triton kernels have no autograd
    for kind in ("dense", "flex"):
        model.zero_grad(set_to_none=True)
        total, logits = 0.0, []
        for row in rows:
            mask = dense_mask(row.meta) if kind == "dense" else block_mask(row.meta)
            lg = replay_logits(model, row, mask)
            total = (
                total
                + combine(row_terms(lg, lg.detach(), row, spec), p.responses, p.aec_den, spec)[0]
            )
            logits.append(lg.detach())
        total.backward()
        out[kind] = torch.cat(logits), model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    ops.use(None)
    assert (out["flex"][0] - out["dense"][0]).abs().max().item() < 1e-3
    assert torch.allclose(out["flex"][1], out["dense"][1], atol=1e-4, rtol=1e-2)


def test_replay_reproduces_the_rollout_logits_on_cuda(tmp_path):
    model, path = _model(tmp_path)
    rs, _, _ = _rows(model, path)
    from dlmrt.train.orl.plan import Doc, Target

    r = rs[0]
    with torch.no_grad():
        for s in r.states:
            row = build_row([Doc(r, [s], 1.0, [Target()])], model.cfg.vocab_size, CUDA, 128)
            got = replay_logits(model, row, block_mask(row.meta))
            assert (got - s.logits).abs().max().item() < 1e-3, (s.block, s.round)


def test_a_short_bf16_flex_run(tmp_path):
    cfg = ORLConfig(
        steps=2,
        rollouts_per_prompt=4,
        max_new_tokens=48,
        verifier_workers=0,
        check_replay=True,
        lr=1e-4,
        device="cuda",
    )
    res = train_orl(cfg, tmp_path / "o", progress=False)
    assert [e["step"] for e in res.entries] == [1, 2]
    assert all("replay_max_abs_err" in e for e in res.entries)
    assert LLM(tmp_path / "o", role="orl").model.adapter is not None


@pytest.mark.parametrize("mode", ["block_graph", "round_graph"])
def test_capture_in_graph_modes_equals_eager_capture(tmp_path, mode):
    """The trainer's StateCapture gets the same states from the captured rounds as eagerly."""
    model, path = _model(tmp_path)
    tok = Tokenizer(path)
    cfg = ORLConfig(model=str(path), rollouts_per_prompt=2, max_new_tokens=24, verifier_workers=0)
    got = {}
    for m in ("eager", mode):
        llm = LLM.from_model(model, tok, path=path, role="orl", mode=m)
        got[m] = generate_rollouts(llm, PROMPTS, cfg, 0)
    for a, b in zip(got["eager"], got[mode], strict=True):
        assert a.token_ids == b.token_ids and len(a.states) == len(b.states) > 0
        for sa, sb in zip(a.states, b.states):
            assert (sa.block, sa.round) == (sb.block, sb.round)
            for name in ("canvas", "unresolved", "accepted"):
                assert torch.equal(getattr(sa, name), getattr(sb, name)), name
            assert torch.allclose(sa.z, sb.z, atol=1e-5) and torch.allclose(sa.entropy, sb.entropy)
