"""`dlmrt train orl` end to end on the demo model (CPU): a 3-step run, kill -9 + --resume, DDP."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrt.llm import LLM
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.loop import train_orl
from dlmrt.train.orl.recipe import load_recipe, to_toml

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(
    rollouts_per_prompt=3,
    max_new_tokens=40,
    verifier_workers=0,
    lr=1e-4,
    temperature=1.5,
    device="cpu",
)
TIMING = ("rollout_s", "step_s", "train_time_s")


def _steps(out: Path) -> list[dict]:
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in e.items() if k not in TIMING} for e in lines if "loss" in e]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_three_step_run_from_the_cli(tmp_path):
    """The recipe + flags, log.jsonl per step, checkpoints, OUT loads with role='orl'."""
    recipe = tmp_path / "r.toml"
    recipe.write_text(to_toml(ORLConfig(steps=3, save_every=2, **SMALL), out=str(tmp_path / "o")))
    cmd = [
        sys.executable,
        "-m",
        "dlmrt",
        "train",
        "orl",
        "--recipe",
        str(recipe),
        "--check-replay",
        "--no-progress",
    ]
    res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "o"
    log = _steps(out)
    assert [e["step"] for e in log] == [1, 2, 3]
    for e in log:
        assert e["rollouts"] == 3 and 0 <= e["reward"] <= 1 and e["rollout_tpf"] > 0
        assert e["replay_max_abs_err"] <= 1e-5
        if e["optimizer_step"]:
            assert e["states"] > 0 and e["update_backbone"] > 0 and e["loss"] > 0
    assert any(e["optimizer_step"] for e in log)
    saved = json.loads((out / "orl_config.json").read_text())
    assert saved["check_replay"] is True and saved["steps"] == 3
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-0000002",
        "step-0000003",
    ]
    assert "orl_residual" in json.loads((out / "config.json").read_text())
    llm = LLM(out, role="orl")
    assert llm.default_rule == "entropy_budget" and llm.model.adapter is not None


@pytest.fixture
def one_thread():
    """Bit-exact CPU runs need one intra-op thread: with several, torch's CPU reductions make two
    identical runs differ at ~1e-9 (docs/orl-training.md)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


KILL = """
import os, signal, sys
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.loop import train_orl
def kill(step):
    if step == 3:  # after step 3, whose checkpoint (every 2 steps) was never written
        os.kill(os.getpid(), signal.SIGKILL)
train_orl(ORLConfig(**{cfg}), sys.argv[1], progress=False, on_step=kill)
"""


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_same_log_and_weights(tmp_path, one_thread):
    cfg = dict(steps=4, save_every=2, **SMALL)
    straight = train_orl(ORLConfig(**cfg), tmp_path / "a", progress=False)
    script = tmp_path / "kill.py"
    script.write_text(KILL.replace("{cfg}", repr(cfg)))
    res = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "b")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == -9, res.stderr
    assert len(_steps(tmp_path / "b")) == 3  # step 3 was logged, then lost with the kill
    resumed = train_orl(ORLConfig(**cfg), tmp_path / "b", resume=True, progress=False)
    assert [e["step"] for e in resumed.entries] == [3, 4]
    assert _steps(tmp_path / "b") == _steps(tmp_path / "a")
    assert any(e["optimizer_step"] for e in straight.entries)
    a = load_file(str(tmp_path / "a" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_process_gloo_equals_one_process(tmp_path):
    args = [
        "train",
        "orl",
        "--steps",
        "2",
        "--prompts-per-step",
        "2",
        "--rollouts-per-prompt",
        "2",
        "--max-new-tokens",
        "40",
        "--verifier-workers",
        "0",
        "--lr",
        "1e-4",
        "--temperature",
        "1.5",
        "--device",
        "cpu",
        "--no-progress",
    ]
    one = subprocess.run(
        [sys.executable, "-m", "dlmrt", *args, "--out", str(tmp_path / "one")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert one.returncode == 0, one.stderr
    run = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        "29517",
        "-m",
        "dlmrt",
        *args,
        "--out",
        str(tmp_path / "two"),
    ]
    two = subprocess.run(run, env=_env(), capture_output=True, text=True, timeout=180)
    assert two.returncode == 0, two.stderr
    la, lb = _steps(tmp_path / "one"), _steps(tmp_path / "two")
    assert [e["step"] for e in lb] == [1, 2] and any(e["optimizer_step"] for e in la)
    for ea, eb in zip(la, lb):
        assert ea.keys() == eb.keys()
        for k in ea:  # a diagnostic with nothing to measure (no rows) is null in both
            same = ea[k] is None if eb[k] is None else ea[k] == pytest.approx(eb[k], 1e-6, 1e-6)
            assert same, (k, ea[k], eb[k])
    a = load_file(str(tmp_path / "one" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "model.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


def test_recipe_round_trip_and_errors(tmp_path):
    cfg = ORLConfig(steps=7, gamma=8.0, entropy_gate=True, **SMALL)
    path = tmp_path / "r.toml"
    path.write_text(to_toml(cfg, out="runs/x"))
    raw = load_recipe(path)
    assert raw.pop("out") == "runs/x" and ORLConfig(**raw) == cfg
    shipped = load_recipe(ROOT / "recipes" / "arithmetic-orl.toml")
    assert shipped.pop("out") == "runs/arithmetic-orl"
    every = {f.name for f in dataclasses.fields(ORLConfig)} - {
        "model",
        "gamma",
        "data",
        "device",
        "rule",
        "entropy_budget",
        "threshold",
        "adapter_intermediate_size",
        "adapter_post_norm_scale",
    }
    assert set(shipped) == every  # every knob that has a value, recorded
    assert ORLConfig(**shipped).rollouts_per_prompt == 8
    demo_runs = [f"{t}-orl{v}" for t in ("chain", "sumset") for v in ("", "-no-aec", "-refresh25")]
    demo_runs += ["sumset-orl-lr1e5", "sumset-orl-no-aec-lr1e5", "sumset-orl-refresh25-lr1e5"]
    for name in demo_runs:  # the ORL demo's runs
        demo = load_recipe(ROOT / "recipes" / f"{name}.toml")
        assert demo.pop("out") == f"runs/{name}" and set(demo) == every, name
        ORLConfig(**demo)
    path.write_text("stepz = 3\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['stepz'\]"):
        load_recipe(path)
    with pytest.raises(ValueError, match="aec_rho: must be in"):
        ORLConfig(aec_rho=1.5)
    with pytest.raises(ValueError, match="rollout_mode"):
        ORLConfig(rollout_mode="fast")


def test_rollout_refresh_runs_rollouts_on_a_snapshot_refreshed_every_n_steps(tmp_path, monkeypatch):
    import dlmrt.train.orl.loop as loop

    seen = []  # per step: (the rollout model's first weight, is it the trained model itself)
    real = loop.generate_rollouts

    def spy(llm, *args, **kw):
        seen.append(next(llm.model.parameters()).detach().clone())
        return real(llm, *args, **kw)

    monkeypatch.setattr(loop, "generate_rollouts", spy)
    cfg = {**SMALL, "temperature": 0.3, "max_new_tokens": 64}  # verified rollouts: updates
    res = train_orl(
        ORLConfig(steps=3, save_every=3, rollout_refresh=2, check_replay=False, **cfg),
        tmp_path / "r",
        progress=False,
    )
    assert all(e["optimizer_step"] for e in res.entries[:2])
    assert torch.equal(seen[0], seen[1])  # u = 1: still the snapshot of u = 0
    assert not torch.equal(seen[1], seen[2])  # u = 2: refreshed with two updates in it
    trained = load_file(str(tmp_path / "r" / "checkpoints" / "step-0000003" / "model.safetensors"))
    assert trained  # the run saved the trained (not the snapshot's) weights
    with pytest.raises(ValueError, match="check_replay"):
        ORLConfig(rollout_refresh=5, check_replay=True)
