"""Block-diffusion SFT on the CPU: loss goes down, regression file, LLM round trip, exact resume.

The regression file tests/assets/train_sft_loss.json is written by
    python tests/train/test_train_sft.py --update-regression
(the fixed tiny run below); never edit it by hand.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrt.train.config import TrainConfig
from dlmrt.train.trainer import train_sft

REGRESSION = Path(__file__).parents[1] / "assets" / "train_sft_loss.json"
TINY = dict(
    device="cpu",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    block_size=8,
    max_position_embeddings=512,
    tokenizer_problems=500,
    pack_rows=512,
    grad_accum=2,
    lr=3e-3,
    warmup_steps=2,
    eval_every=0,
    save_every=1000,
    log_every=1,
)


def tiny(**overrides) -> TrainConfig:
    return TrainConfig(**{**TINY, **overrides})


def regression_run(out: Path) -> dict:
    cfg = tiny(steps=4)
    res = train_sft(cfg, out, progress=False)
    return {
        "command": "python tests/train/test_train_sft.py --update-regression",
        "torch": torch.__version__,
        "config": dataclasses.asdict(cfg),
        "losses": [res.losses[s] for s in range(1, cfg.steps + 1)],
    }


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_a_few_steps_reduce_the_loss(tmp_path):
    res = train_sft(tiny(steps=12), tmp_path / "run", progress=False)
    losses = [res.losses[s] for s in range(1, 13)]
    assert losses[0] > 5.5  # ~ln(vocab) at initialisation
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses


def test_loss_matches_the_regression_file(tmp_path):
    expected = json.loads(REGRESSION.read_text())
    got = regression_run(tmp_path / "run")
    assert got["config"] == expected["config"], "the regression run changed: regenerate the file"
    # fp32 on the CPU: equal to rounding across BLAS builds, far tighter than any semantic change.
    torch.testing.assert_close(
        torch.tensor(got["losses"]), torch.tensor(expected["losses"]), rtol=2e-4, atol=2e-4
    )


def test_every_parameter_gets_a_gradient(tmp_path):
    from dlmrt.models.config import model_config_from_hf
    from dlmrt.train.data import SFTPacks
    from dlmrt.train.masks import dense_mask
    from dlmrt.train.model import build_model
    from dlmrt.train.run_dir import setup_run_dir
    from dlmrt.train.sft_loss import sft_loss

    cfg = tiny()
    setup_run_dir(cfg, tmp_path)
    mc = model_config_from_hf(json.loads((tmp_path / "config.json").read_text()), tmp_path)
    model = build_model(mc, torch.device("cpu"), 0)
    batch = SFTPacks("arithmetic", tmp_path, mc.block_size, 512, 0.5, 0)[0]
    sft_loss(model, batch, dense_mask(batch.meta), mc.block_size).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, trained once


def test_train_save_load_generate_round_trip(tmp_path):
    from dlmrt import LLM
    from dlmrt.cli import main

    out = tmp_path / "run"
    argv = ["train", "sft", "--out", str(out), "--no-progress", "--steps", "3"]
    for key, value in TINY.items():
        if key not in ("eval_every",):
            argv += ["--" + key.replace("_", "-"), str(value)]
    argv += ["--eval-every", "3", "--eval-problems", "2", "--eval-max-new-tokens", "16"]
    assert main(argv) == 0
    log = _log(out)
    assert [e["step"] for e in log if "loss" in e] == [1, 2, 3]
    (ev,) = [e["eval"] for e in log if "eval" in e]
    assert ev["problems"] == 2 and 0.0 <= ev["accuracy"] <= 1.0 and ev["tokens_per_forward"] > 0

    llm = LLM(str(out))  # the run directory is an HF checkpoint, loaded as-is
    assert llm.model_config.block_size == 8 and llm.mask_id == 3 and llm.stop_ids == {0, 2}
    assert llm.default_rule == "threshold"
    trained = load_file(str(out / "checkpoints" / "step-0000003" / "model.safetensors"))
    loaded = llm.model.state_dict()
    for name, t in trained.items():
        assert torch.equal(loaded[name].float(), t), name
    res = llm.generate("What is 12 + 30?", chat=True, max_new_tokens=16)
    assert res.num_denoising_forwards >= 1 and len(res.token_ids) >= 1
    assert main(["generate", "--model", str(out), "--max-new-tokens", "8", "What is 1 + 2?"]) == 0
    ev_argv = ["train", "eval", "--model", str(out), "--problems", "2", "--max-new-tokens", "16"]
    assert main([*ev_argv, "--threshold", "0.5", "--out", str(tmp_path / "eval.json")]) == 0
    ev = json.loads((tmp_path / "eval.json").read_text())
    assert ev["rule"] == "threshold" and ev["threshold"] == 0.5 and ev["problems"] == 2

    shipped = tmp_path / "shipped"
    assert main(["train", "export", str(out), str(shipped)]) == 0
    assert LLM(str(shipped)).generate("What is 1 + 2?", max_new_tokens=8).token_ids
    assert (
        load_file(str(shipped / "model.safetensors"))["model.norm.weight"].dtype == torch.bfloat16
    )


class Killed(Exception):
    pass


def test_resume_after_a_kill_continues_identically(tmp_path):
    cfg = tiny(steps=6, save_every=2)
    straight = train_sft(cfg, tmp_path / "a", progress=False)

    def kill_after_5(step: int) -> None:
        if step == 5:  # after step 5, whose checkpoint (every 2 steps) was never written
            raise Killed

    with pytest.raises(Killed):
        train_sft(cfg, tmp_path / "b", progress=False, on_step=kill_after_5)
    resumed = train_sft(cfg, tmp_path / "b", resume=True, progress=False)
    assert sorted(resumed.losses) == [5, 6]  # continued at the last checkpoint (step 4)
    assert [resumed.losses[s] for s in (5, 6)] == [straight.losses[s] for s in (5, 6)]
    log = [e for e in _log(tmp_path / "b") if "loss" in e]
    assert [e["step"] for e in log] == [1, 2, 3, 4, 5, 6]  # the lost step 5 was rewritten once
    assert [e["loss"] for e in log] == [straight.losses[s] for s in range(1, 7)]
    a = load_file(str(tmp_path / "a" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == [
        "step-0000004",
        "step-0000006",
    ]


def test_data_workers_build_the_same_packs(tmp_path):
    a = train_sft(tiny(steps=2, data_workers=0), tmp_path / "a", progress=False)
    b = train_sft(tiny(steps=2, data_workers=1), tmp_path / "b", progress=False)  # spawned
    assert a.losses == b.losses


def test_run_directory_guards(tmp_path):
    train_sft(tiny(steps=1), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match="already holds a run"):
        train_sft(tiny(steps=1), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match="lr differ"):
        train_sft(tiny(steps=2, lr=1e-2), tmp_path / "run", resume=True, progress=False)
    res = train_sft(tiny(steps=2), tmp_path / "run", resume=True, progress=False)  # more steps: ok
    assert res.step == 2 and sorted(res.losses) == [2]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update-regression"]:
        sys.exit("usage: python tests/train/test_train_sft.py --update-regression")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = regression_run(Path(tmp) / "run")
    REGRESSION.parent.mkdir(exist_ok=True)
    REGRESSION.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {REGRESSION}: losses {result['losses']}")


def test_a_full_disk_at_a_checkpoint_is_named_and_leaves_no_partial_step(tmp_path, monkeypatch):
    """The save of step 2 fails as a full disk would: the CLI names it (rc 1, no traceback), no
    .step-N.tmp stays behind, and step 1's checkpoint is intact."""
    import errno

    from dlmrt.cli import main
    from dlmrt.train import run_dir

    real = run_dir.save_weights

    def save_weights(model, path):
        if "0000002" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(model, path)

    monkeypatch.setattr(run_dir, "save_weights", save_weights)
    out = tmp_path / "run"
    argv = ["train", "sft", "--out", str(out), "--no-progress", "--steps", "3"]
    for key, value in TINY.items():
        argv += ["--" + key.replace("_", "-"), str(value if key != "save_every" else 1)]
    assert main(argv) == 1
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001"]
    assert (root / "step-0000001" / "model.safetensors").is_file()
