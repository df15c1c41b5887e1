"""The start model (adapter kept, rescaled by gamma or added), the capture bound, the verifier."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import write_checkpoint
from orl_helpers import rollouts, tiny_orl

from dlmrt.tasks import get_task
from dlmrt.train.orl.capture import CaptureLimitError, Rollout
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.loop import train_orl
from dlmrt.train.orl.rollout import VerifierPool, step_prompts
from dlmrt.train.orl.start import start_model

CPU = torch.device("cpu")


def _forward(model, ids):
    from dlmrt.attention import AttnContext

    z = torch.randn(8, model.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    ctx = AttnContext(torch.arange(ids.shape[0]), model.cfg.block_size)
    with torch.no_grad():
        return model(ids, ctx, z=z, receives=torch.ones(8, dtype=torch.bool))


def test_gamma_rescales_once_without_changing_the_function(tmp_path):
    model, _, path = tiny_orl(tmp_path)
    ids = torch.randint(0, 200, (16,))
    before = _forward(model, ids)
    scaled, raw = start_model(ORLConfig(model=str(path), gamma=8.0), path, CPU)
    assert raw["orl_residual"]["input_scale"] == 1 / 8 and scaled.adapter.output_scale == 1 / 8
    w0, w1 = model.adapter.gate_proj.weight, scaled.adapter.gate_proj.weight
    assert torch.allclose(w1, 8 * w0)
    assert torch.allclose(_forward(scaled, ids), before, atol=1e-5)


def test_a_base_model_gets_a_zero_output_adapter(tmp_path):
    path = write_checkpoint(tmp_path / "base")
    model, raw = start_model(ORLConfig(model=str(path)), path, CPU)
    a = model.adapter
    assert raw["orl_residual"]["intermediate_size"] == raw["intermediate_size"]
    assert torch.equal(a.down_proj.weight, torch.zeros_like(a.down_proj.weight))
    assert 0.5e-3 < a.gate_proj.weight.std().item() < 2e-3 and torch.all(a.norm.weight == 1)
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="gamma: rescales an existing adapter"):
        start_model(ORLConfig(model=str(path), gamma=8.0), path, CPU)


def test_not_a_qwen_checkpoint_is_a_clear_error(tmp_path):
    path = write_checkpoint(tmp_path / "x")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["LLaDA2MoeModelLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="ORL trains QwenDLM-format models"):
        start_model(ORLConfig(model=str(path)), path, CPU)


def test_the_capture_bound_fails_clearly(tmp_path):
    _, llm, path = tiny_orl(tmp_path)
    with pytest.raises(CaptureLimitError, match="capture_limit=3"):
        rollouts(llm, path, n=1, capture_limit=3)


def test_verifier_pool_matches_the_task_verifier():
    task = get_task("arithmetic")
    prompts = step_prompts(task, ORLConfig(prompts_per_step=2), 3)
    assert [p.index for p in prompts] == [6, 7]
    texts = [f"x. The answer is {prompts[0].answer}.", "The answer is -1."]
    rs = [Rollout(0, [], [], t, prompts[0].answer, [], 0) for t in texts]
    with VerifierPool("arithmetic", None, 1) as pool:  # one spawned process
        pool.verify(rs)
    assert [r.verified for r in rs] == [True, False]


def test_the_verifier_pool_outlives_a_stop_signal_to_the_process_group():
    """`timeout` / Ctrl-C signal the whole group: the workers must keep serving the step the
    trainer finishes before it saves (they broke the pool, and the save, before)."""
    import os
    import signal
    import time

    task = get_task("arithmetic")
    (p,) = step_prompts(task, ORLConfig(prompts_per_step=1), 0)
    rs = [Rollout(0, [], [], f"The answer is {p.answer}.", p.answer, [], 0)]
    with VerifierPool("arithmetic", None, 1) as pool:
        pool.verify(rs)  # the worker is up (its initializer has run)
        for pid in list(pool.pool._processes):
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        rs[0].verified = None
        pool.verify(rs)
    assert rs[0].verified is True


def test_a_step_without_verified_rollouts_makes_no_optimizer_step(tmp_path, monkeypatch):
    monkeypatch.setattr("dlmrt.train.orl.rollout._verify", lambda task, data, text, answer: False)
    cfg = ORLConfig(
        steps=1, rollouts_per_prompt=2, max_new_tokens=16, verifier_workers=0, device="cpu"
    )
    res = train_orl(cfg, tmp_path / "o", progress=False)
    (entry,) = res.entries
    assert entry["optimizer_step"] is False and entry["verified"] == 0 and "grad_norm" not in entry


def test_an_orl_run_does_not_inherit_its_start_models_decoder(tmp_path):
    """The start model's generation_config.json 'dlmrt_decoder' (its own best decoder) is not the
    ORL run's: the run directory gets the file without it, the other entries kept."""
    import shutil

    from dlmrt.demo import demo_model_path
    from dlmrt.train.orl.run_dir import open_orl_run

    src = tmp_path / "start"
    shutil.copytree(demo_model_path(), src)
    gen = json.loads((src / "generation_config.json").read_text())
    gen["dlmrt_decoder"] = {"rule": "threshold", "threshold": 0.7}
    (src / "generation_config.json").write_text(json.dumps(gen))
    cfg = ORLConfig(model=str(src), device="cpu")
    open_orl_run(cfg, tmp_path / "run", False, torch.device("cpu"))
    written = json.loads((tmp_path / "run" / "generation_config.json").read_text())
    del gen["dlmrt_decoder"]
    assert written == gen
