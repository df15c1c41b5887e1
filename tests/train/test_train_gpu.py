"""SFT on CUDA (run on the device machine: pytest -m gpu tests/train/test_train_gpu.py).

flex_attention BlockMask == dense SDPA mask (outputs and gradients); Triton kernels (no autograd)
are switched off for training and back on after; bf16 + flex training reduces the loss.
"""

from __future__ import annotations

import json

import pytest
import torch

from dlmrt import ops
from dlmrt.attention import AttnContext
from dlmrt.models.config import model_config_from_hf
from dlmrt.train.config import TrainConfig
from dlmrt.train.data import SFTPacks
from dlmrt.train.masks import block_mask, dense_mask
from dlmrt.train.model import build_model
from dlmrt.train.run_dir import setup_run_dir
from dlmrt.train.sft_loss import sft_loss
from dlmrt.train.trainer import train_sft

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-run")
    setup_run_dir(TrainConfig(tokenizer_problems=2000), out)
    return out


def _model_and_batch(run_dir, rows: int = 2048):
    mc = model_config_from_hf(json.loads((run_dir / "config.json").read_text()), run_dir)
    model = build_model(mc, CUDA, 0)
    return model, mc, SFTPacks("arithmetic", run_dir, mc.block_size, rows, 0.5, 0)[0].to(CUDA)


def test_flex_equals_dense_forward_and_backward(run_dir):
    ops.use("torch")
    try:
        model, mc, batch = _model_and_batch(run_dir)
        grads = []
        for mask in (block_mask(batch.meta), dense_mask(batch.meta)):
            model.zero_grad()
            loss = sft_loss(model, batch, mask, mc.block_size)
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            logits = model(batch.input_ids, AttnContext(batch.positions, mc.block_size, mask=mask))
            grads[-1].append(logits.detach())
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-3)
    finally:
        ops.use(None)


def test_every_parameter_gets_a_gradient_on_cuda(run_dir):
    ops.use("torch")
    try:
        model, mc, batch = _model_and_batch(run_dir)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = sft_loss(model, batch, block_mask(batch.meta), mc.block_size)
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    finally:
        ops.use(None)


def test_training_on_cuda_reduces_loss_and_restores_the_kernels(tmp_path):
    cfg = TrainConfig(
        steps=30,
        pack_rows=8192,
        tokenizer_problems=2000,
        lr=2e-3,
        warmup_steps=5,
        eval_every=30,
        eval_problems=8,
        log_every=1,
    )
    res = train_sft(cfg, tmp_path / "run", progress=False)
    first, last = res.losses[1], sum(res.losses[s] for s in range(26, 31)) / 5
    assert last < first - 1.0, res.losses
    assert res.evals and res.evals[-1]["problems"] == 8
    assert ops._IMPL == {}  # re-resolved from the environment after training
    from dlmrt import LLM

    out = LLM(str(tmp_path / "run")).generate("What is 1 + 2?", max_new_tokens=16)
    assert out.token_ids
