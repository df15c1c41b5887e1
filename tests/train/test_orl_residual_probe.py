"""How much an ORL model uses its residual pathway (issue 39): the residual-to-embedding ratio and
the adapter's output update in the trainer's log, and the adapter's AdamW eps."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import write_checkpoint
from orl_helpers import crafted_rollout, rollouts, tiny_orl

from dlmrt.cli import main
from dlmrt.models.residual import ResidualAdapter, ResidualConfig
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.plan import plan
from dlmrt.train.orl.residual_probe import ResidualProbe
from dlmrt.train.orl.start import init_adapter
from dlmrt.train.orl.step import Replayer, optimizer_step, param_groups

CPU = torch.device("cpu")


def _adapter(positions: str = "masked", strength: float = 2.0) -> ResidualAdapter:
    torch.manual_seed(0)
    cfg = ResidualConfig(intermediate_size=6, strength=strength, positions=positions)
    adapter = ResidualAdapter(4, cfg)
    with torch.no_grad():
        adapter.down_proj.weight.normal_()
    return adapter


@pytest.mark.parametrize("positions, rows", [("masked", [1, 3]), ("block", [1, 2, 3])])
def test_the_ratio_counts_the_rows_that_receive_a_nonzero_z(positions, rows):
    """Row 0 (z = 0: a block's first round) never counts; row 2 (resolved) only when the
    adapter feeds the whole block."""
    adapter = _adapter(positions)
    tok = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    z = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    z[0] = 0
    unresolved = torch.tensor([True, True, False, True])
    probe = ResidualProbe(adapter, CPU)
    with torch.no_grad():
        g = adapter(z)
    probe.add_replay(tok, z, g, unresolved)
    probe.add_replay(tok, z, g, unresolved)  # a second packed row: the sums add up
    want = ((2.0 * g[rows]).square().sum() / tok[rows].square().sum()).sqrt().item()
    got = probe.ratio()
    assert got["residual_rows"] == 2 * len(rows)
    assert got["residual_ratio"] == pytest.approx(want, rel=1e-6)


def test_the_output_sample_keeps_residual_rows_up_to_the_limit():
    # crafted states: round k has rows k.. unresolved and z = k everywhere (round 0: z = 0)
    states = crafted_rollout(prompt_len=3, n_tokens=10, block=4, rounds=[3, 2]).states
    receiving = sum(4 - s.round for s in states if s.round > 0)  # (3 + 2) + 3 rows
    probe = ResidualProbe(_adapter(), CPU, limit=100)
    probe.keep_rows(states)
    assert probe.sample.shape == (receiving, 4) and bool((probe.sample != 0).all())
    small = ResidualProbe(_adapter(), CPU, limit=4)
    small.keep_rows(states)
    assert small.sample.shape == (4, 4)
    empty = ResidualProbe(_adapter(), CPU)  # a rank (or step) without residual rows
    empty.keep_rows([s for s in states if s.round == 0])
    empty.output_before()
    assert empty.sample.shape == (0, 4)
    assert empty.output_update() == {"update_adapter_output": None}
    assert empty.ratio() == {"residual_ratio": None, "residual_rows": 0}


def _hand_adapter(adapter: ResidualAdapter, z: torch.Tensor) -> torch.Tensor:
    """g(z) written out from the weights: s_out W_d[SiLU(W_g u) * W_u u], u = s_in RMSNorm_w(z)."""
    c = adapter.cfg
    u = z * torch.rsqrt(z.square().mean(-1, keepdim=True) + c.norm_eps) * adapter.norm.weight
    u = c.input_scale * u
    act = F.silu(u @ adapter.gate_proj.weight.T) * (u @ adapter.up_proj.weight.T)
    return c.output_scale * act @ adapter.down_proj.weight.T


def _setup(tmp_path, positions="masked", **cfg_kw):
    model, llm, path = tiny_orl(tmp_path, positions)
    cfg = ORLConfig(verifier_workers=0, **cfg_kw)
    return model, llm, path, cfg, Replayer(cfg, model, CPU, "dense", False)


def _step(model, cfg, probe):
    opt = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return optimizer_step(model, opt, sched, cfg, probe)


def _residual_rows(model, cfg, rs, receiving: bool = True):
    """Per replayed state: (z rows, E[canvas] rows), with z != 0 and, if `receiving`, received."""
    p = plan(rs, cfg.select_fraction, cfg.aec_gate, model.cfg.vocab_size)
    out = []
    for s in (s for d in p.docs for s in d.states):
        m = s.z.abs().sum(-1) > 0
        if receiving:
            m &= model.adapter.receives(s.unresolved)
        out.append((s.z[m], model.embed_table[s.canvas[m]]))
    return out


@pytest.mark.parametrize("positions", ["masked", "block"])
def test_the_logged_ratio_matches_a_hand_computation(tmp_path, positions):
    model, llm, path, cfg, replayer = _setup(tmp_path, positions)
    model.adapter.cfg = dataclasses.replace(model.adapter.cfg, strength=1.5)
    rs = rollouts(llm, path, n=1, tap_first=False)
    stats = replayer.losses(rs, ResidualProbe(model.adapter, CPU))
    num = den = 0.0
    rows = 0
    with torch.no_grad():
        for z, emb in _residual_rows(model, cfg, rs):
            num += (1.5 * _hand_adapter(model.adapter, z)).square().sum().item()
            den += emb.square().sum().item()
            rows += z.shape[0]
    assert stats["residual_rows"] == rows > 0
    assert stats["residual_ratio"] == pytest.approx(math.sqrt(num / den), rel=1e-5)


def test_a_fresh_adapter_logs_zero_and_its_output_update_is_not_its_weight_update(tmp_path):
    """W_d = 0: a ratio of exactly 0 and no relative output update (g = 0). One step later W_d
    is non-zero: the output moves by a large fraction of itself while ||dW|| / ||W|| (the norm
    gain's ones dominate ||W||) stays small."""
    model, llm, path, cfg, replayer = _setup(tmp_path, lr=1e-3)
    init_adapter(model, cfg.adapter_init_std, 0)
    rs = rollouts(llm, path, n=1, tap_first=False)
    probe = ResidualProbe(model.adapter, CPU)
    stats = replayer.losses(rs, probe)
    assert stats["residual_rows"] > 0 and stats["residual_ratio"] == 0.0
    first = _step(model, cfg, probe)
    assert first["update_adapter_output"] is None and first["update_adapter"] > 0
    probe = ResidualProbe(model.adapter, CPU)
    assert replayer.losses(rs, probe)["residual_ratio"] > 0
    second = _step(model, cfg, probe)
    assert second["update_adapter_output"] > 10 * second["update_adapter"]


def test_the_output_update_is_measured_on_the_residual_rows(tmp_path):
    model, llm, path, cfg, replayer = _setup(tmp_path, positions="masked", lr=1e-3)
    rs = rollouts(llm, path, n=1, tap_first=False)
    probe = ResidualProbe(model.adapter, CPU)
    replayer.losses(rs, probe)
    before = copy.deepcopy(model.adapter)
    out = _step(model, cfg, probe)

    def rel(rows):
        z = torch.cat([z for z, _ in rows])
        with torch.no_grad():
            g0 = _hand_adapter(before, z)
            return ((_hand_adapter(model.adapter, z) - g0).norm() / g0.norm()).item()

    want = rel(_residual_rows(model, cfg, rs))
    assert out["update_adapter_output"] == pytest.approx(want, rel=1e-4)
    # the rows matter: every row with z != 0, resolved ones included, gives another number
    assert abs(rel(_residual_rows(model, cfg, rs, receiving=False)) - want) > 1e-3 * want


def test_adam_eps_reaches_the_adapter_groups_only(tmp_path):
    with pytest.raises(ValueError, match="adapter_adam_eps"):
        ORLConfig(adapter_adam_eps=0.0)
    assert ORLConfig().adapter_adam_eps < 1e-12  # below a fresh adapter's sqrt(v) ~ 6e-9
    model, _, _ = tiny_orl(tmp_path)
    cfg = ORLConfig(adapter_adam_eps=3e-11)
    opt = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr)
    adapter = {id(p) for p in model.adapter.parameters()}
    for g in opt.param_groups:
        is_adapter = {id(p) for p in g["params"]} <= adapter
        assert g["adapter"] is is_adapter
        assert g["eps"] == (3e-11 if is_adapter else 1e-8)  # 1e-8: torch's default
    assert {g["adapter"] for g in opt.param_groups} == {True, False}


def test_a_cli_run_logs_the_diagnostics_and_saves_the_adapter_eps(tmp_path, monkeypatch):
    """`dlmrt train orl --adapter-adam-eps` reaches the saved optimizer state; a run from a Base
    model (a fresh adapter: W_d = 0) logs a ratio of exactly 0 on its first step. The tiny random
    model decodes its blocks in several rounds (rows with z != 0); every rollout counts as
    verified, so the step updates."""
    monkeypatch.setattr("dlmrt.train.orl.rollout._verify", lambda task, data, text, answer: True)
    out = tmp_path / "o"
    argv = [
        "train",
        "orl",
        "--model",
        str(write_checkpoint(tmp_path / "base")),
        "--out",
        str(out),
        "--steps",
        "1",
        "--rollouts-per-prompt",
        "2",
        "--max-new-tokens",
        "24",
        "--verifier-workers",
        "0",
        "--device",
        "cpu",
        "--no-progress",
        "--adapter-adam-eps",
        "3e-11",
    ]
    assert main(argv) == 0
    (entry,) = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert entry["optimizer_step"] and entry["residual_rows"] > 0
    assert entry["residual_ratio"] == 0.0 and entry["update_adapter_output"] is None
    state = torch.load(
        out / "checkpoints" / "step-0000001" / "trainer_state.pt", weights_only=False
    )
    eps = {g["adapter"]: g["eps"] for g in state["optimizer"]["param_groups"]}
    assert eps == {True: 3e-11, False: 1e-8}
    assert json.loads((out / "orl_config.json").read_text())["adapter_adam_eps"] == 3e-11
