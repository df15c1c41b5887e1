"""The offline residual warm-up stage (`dlmrt train residual`, dlmrt/train/residual_warmup.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrt import LLM
from dlmrt.attention import AttnContext
from dlmrt.cli import main
from dlmrt.demo import demo_model_path
from dlmrt.train.residual_config import WarmupConfig
from dlmrt.train.residual_warmup import accept_lowest_entropy, train


def test_each_block_accepts_its_lowest_entropy_rows_and_keeps_one_masked():
    group = torch.tensor([7, 7, 7, 3, 9, 9, 9, 9, 7])
    entropy = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.4, 0.2, 0.8, 0.6, 0.05])
    counts = {7: 4, 3: 1, 9: 4}
    seen = {g: set() for g in counts}
    for seed in range(200):
        accept = accept_lowest_entropy(entropy, group, torch.Generator().manual_seed(seed))
        for g, size in counts.items():
            rows = (group == g).nonzero().flatten()
            n = int(accept[rows].sum())
            seen[g].add(n)
            assert n < size  # at least one row of every block stays masked
            lowest = rows[torch.argsort(entropy[rows])[:n]]
            assert accept[lowest].all()  # the accepted rows are the block's least uncertain
    assert seen == {7: {0, 1, 2, 3}, 3: {0}, 9: {0, 1, 2, 3}}  # n ~ U{0 .. size - 1}


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("steps", 0, "steps: must be >= 1"),
        ("adapter_lr", float("nan"), "adapter_lr: must be finite"),
    ],
)
def test_a_bad_setting_is_named(field, value, match):
    with pytest.raises(ValueError, match=match):
        WarmupConfig(**{field: value})


def test_the_stage_trains_backbone_and_adapter_and_writes_an_orl_checkpoint(tmp_path: Path, capsys):
    out = tmp_path / "warm"
    rc = main(
        [
            "train",
            "residual",
            "--out",
            str(out),
            "--task",
            "arithmetic",
            "--steps",
            "3",
            "--rows",
            "256",
            "--log-every",
            "1",
            "--adapter-lr",
            "1e-2",
        ]
    )
    assert rc == 0 and json.loads(capsys.readouterr().out)["out"] == str(out)
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    first = lines[0]
    # W_d starts off zero (down_init_std): the residual is small but already not nothing
    assert 0 < first["residual_ratio"] < 0.1 and 0 <= first["accepted"] < 1
    assert lines[-1]["residual_ratio"] > first["residual_ratio"]  # the adapter learned
    base = load_file(str(demo_model_path() / "model.safetensors"))
    warm = load_file(str(out / "model.safetensors"))
    assert any(not torch.equal(warm[n].to(t.dtype), t) for n, t in base.items())  # backbone too
    assert warm["model.residual_adapter.down_proj.weight"].abs().sum() > 0
    assert json.loads((out / "warmup_config.json").read_text())["steps"] == 3
    llm = LLM(str(out), role="orl", device="cpu")
    assert llm.model.adapter is not None
    assert llm.generate("What is 2 + 3?", max_new_tokens=16).token_ids


def _warm(out: Path, device: str) -> list[dict]:
    cfg = WarmupConfig(task="arithmetic", steps=2, rows=256, log_every=1, device=device)
    train(cfg, out)
    return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_stage_on_cuda_follows_the_cpu_run(tmp_path: Path):
    """Data, noise, acceptance and the W_d init are drawn on the host: fp32 on the GPU sees the
    same rows and accepts the same share as the CPU, with the same losses to summation order."""
    (cpu0, cpu1), (cuda0, cuda1) = _warm(tmp_path / "cpu", "cpu"), _warm(tmp_path / "cuda", "cuda")
    assert cpu0["accepted"] == cuda0["accepted"] and cpu1["accepted"] == cuda1["accepted"]
    for key in ("ce1", "ce2", "residual_ratio"):  # step 0: before any update
        assert cpu0[key] == pytest.approx(cuda0[key], rel=2e-3, abs=2e-5), key
    # after one Adam step (eps 1e-15: near-zero gradients move by a full step, sign and all)
    assert cpu1["residual_ratio"] == pytest.approx(cuda1["residual_ratio"], rel=0.2)
    warm = load_file(str(tmp_path / "cuda" / "model.safetensors"))
    assert warm["model.residual_adapter.down_proj.weight"].abs().sum() > 0


def test_later_passes_take_z_from_a_pass_that_had_z_and_keep_a_row_per_block():
    from dlmrt.train.residual_warmup import GROUP_STRIDE, step_losses

    model, _, batch, _ = _demo_start()
    key = batch.meta.doc.long() * GROUP_STRIDE + batch.meta.block.long()
    one = step_losses(model, batch, torch.Generator().manual_seed(0), passes=1)
    three = step_losses(model, batch, torch.Generator().manual_seed(0), passes=3)
    assert torch.equal(one["ce1"], three["ce1"]) and one["accepted"] == three["accepted"]
    assert set(three["rows2"].tolist()) <= set(one["rows2"].tolist())  # later passes accept more
    assert set(key[three["rows2"]].tolist()) == set(key[batch.loss_rows].tolist())  # a row each
    assert three["z"].shape == (len(three["rows2"]), model.embed_table.shape[1])
    assert torch.equal(three["ids2"][three["rows2"]], batch.input_ids[three["rows2"]])  # masked
    assert torch.equal(one["loss2"], one["ce2"])  # one pass: the loss is its CE
    assert torch.isfinite(three["loss2"]) and not torch.equal(three["loss2"], three["ce2"])


def _demo_start(**start):
    from dlmrt import ops
    from dlmrt.train.data import SFTPacks
    from dlmrt.train.masks import attention_mask
    from dlmrt.train.orl.config import ORLConfig
    from dlmrt.train.orl.start import start_model

    base = demo_model_path()
    ops.use("torch")
    cfg = ORLConfig(model=str(base), task="arithmetic", **start)
    model, raw = start_model(cfg, base, torch.device("cpu"))
    batch = SFTPacks("arithmetic", base, model.cfg.block_size, 256, 0.5, seed=3)[0]
    ctx = AttnContext(
        batch.positions, model.cfg.block_size, mask=attention_mask(batch.meta, "dense")
    )
    return model, raw, batch, ctx


def test_without_a_post_norm_the_first_pass_is_the_plain_forward():
    from dlmrt.train.residual_warmup import _block_logits

    model, _, batch, ctx = _demo_start()
    noisy = batch.meta.noisy.nonzero().flatten()
    with torch.no_grad():
        plain = model(batch.input_ids, ctx)[batch.loss_rows]
        first = _block_logits(model, batch.input_ids, ctx, noisy, batch.loss_rows)
    torch.testing.assert_close(first, plain, rtol=1e-5, atol=1e-5)


def test_a_post_norm_rescales_every_block_row_and_leaves_the_context():
    """The engine gives every row of the block being denoised h = s RMSNorm(E[x] + m g(z)) and the
    context h = E[x] (docs/checkpoint-format.md); the warm-up's passes must do the same."""
    from dlmrt.train.residual_warmup import step_losses

    model, raw, batch, ctx = _demo_start(adapter_post_norm_scale=0.5)
    assert raw["orl_residual"]["post_norm_scale"] == 0.5
    seen = []
    model.model.layers[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    with torch.no_grad():
        step_losses(model, batch, torch.Generator().manual_seed(0), passes=2)
    noisy = batch.meta.noisy
    emb = model.embed_table[batch.input_ids[~noisy]]
    assert len(seen) == 3  # pass 1 and both passes with z
    for h in seen:
        rms = h[noisy].float().pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.full_like(rms, 0.5), rtol=1e-4, atol=1e-4)
        assert torch.equal(h[~noisy], emb)


def test_a_post_norm_is_a_new_adapters_setting(tmp_path: Path):
    out = train(WarmupConfig(task="arithmetic", steps=1, rows=256, post_norm_scale=0.06), tmp_path)
    assert json.loads((out / "config.json").read_text())["orl_residual"]["post_norm_scale"] == 0.06
    llm = LLM(str(out), role="orl", device="cpu")
    assert llm.model.adapter.cfg.post_norm_scale == 0.06
    assert llm.generate("What is 2 + 3?", max_new_tokens=16).token_ids
    with pytest.raises(ValueError, match="adapter_post_norm_scale: sets a new adapter"):
        train(
            WarmupConfig(model=str(out), task="arithmetic", steps=1, post_norm_scale=0.1),
            tmp_path / "again",
        )
    with pytest.raises(ValueError, match="post_norm_scale: must be > 0"):
        WarmupConfig(post_norm_scale=0.0)
