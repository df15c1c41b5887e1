"""A quantized format added from outside the package: its weight type and one implementation
object, registered in the format table (`dlmrt/impls/formats.py`), run a tiny model without any
model file knowing it. CPU."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint
from torch import nn

from dlmrt import LLM
from dlmrt.impls.formats import TABLE, FormatRow, register_format, unregister_format
from dlmrt.loading.placement import install, quantize_candidates

PROMPT, KW = [5, 6, 7, 8, 9], dict(max_new_tokens=12, ignore_eos=True)


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """Toy format: int8 codes, one fp32 scale per output row (symmetric, weight-only)."""

    codes: torch.Tensor
    scale: torch.Tensor

    @staticmethod
    def quantize(w: torch.Tensor) -> Int8Weight:
        scale = w.float().abs().amax(-1).clamp(min=1e-12) / 127
        return Int8Weight(torch.round(w.float() / scale.unsqueeze(-1)).to(torch.int8), scale)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.codes.float() * self.scale.unsqueeze(-1)).to(dtype)

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * self.scale.numel()

    def to(self, device) -> Int8Weight:
        return Int8Weight(self.codes.to(device), self.scale.to(device))


class Int8Linear(nn.Module):
    def __init__(self, weights: list[Int8Weight], dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("codes", torch.cat([w.codes for w in weights]))
        self.register_buffer("scale", torch.cat([w.scale for w in weights]))
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, Int8Weight(self.codes, self.scale).dequantize(self.dtype))


def int8_linear(ins, names, weights, fused_input) -> Int8Linear:
    return Int8Linear([w.to(ins.device) for w in weights], ins.dtype)


@pytest.fixture()
def int8_format():
    register_format(Int8Weight, FormatRow("int8", linear=int8_linear))
    yield
    unregister_format(Int8Weight)
    assert Int8Weight not in TABLE


def _quantized_pair(path):
    """(a model running the toy format, the same model with its weights int8-rounded in bf16
    parameters): their tokens must agree."""
    toy = LLM(path, device="cpu", dtype="float32", mode="eager")
    plain = LLM(path, device="cpu", dtype="float32", mode="eager")
    names = list(quantize_candidates(toy.model))
    params = dict(toy.model.named_parameters())
    weights = {n: Int8Weight.quantize(params[n].detach()) for n in names}
    _, declined = install(toy.model, weights)
    with torch.no_grad():
        for name, p in plain.model.named_parameters():
            if name in weights:
                p.copy_(weights[name].dequantize(p.dtype))
    return toy, plain, names, declined


def test_a_registered_format_runs_every_dense_site_of_a_tiny_qwen(tmp_path, int8_format):
    path = write_checkpoint(tmp_path / "q", residual=residual_config())
    toy, plain, names, declined = _quantized_pair(path)
    assert declined == []  # every candidate is a dense linear: all installed
    layer = toy.model.model.layers[0]
    for module in (layer.self_attn.qkv, layer.self_attn.o_proj, layer.mlp.gate_up.linear):
        assert isinstance(module, Int8Linear)
    assert isinstance(layer.mlp.down_proj, Int8Linear) and isinstance(toy.model.lm_head, Int8Linear)
    assert layer.self_attn.q_proj.weight.numel() == 0  # the bf16 copies freed
    assert toy.generate(PROMPT, **KW).token_ids == plain.generate(PROMPT, **KW).token_ids


def test_a_format_without_an_experts_builder_leaves_the_experts_to_dequantize(
    tmp_path, int8_format
):
    path = write_llada2_checkpoint(tmp_path / "l")
    toy, plain, names, declined = _quantized_pair(path)
    # routed experts: no builder; shared experts: never quantized (their input feeds the router)
    assert declined and all(".mlp.experts." in n or "shared_experts" in n for n in declined)
    assert any(".mlp.experts." in n for n in declined)
    assert any(isinstance(m, Int8Linear) for m in toy.model.modules())
    assert toy.generate(PROMPT, **KW).token_ids == plain.generate(PROMPT, **KW).token_ids


def test_an_unregistered_format_installs_nothing(tmp_path):
    path = write_checkpoint(tmp_path / "q")
    toy = LLM(path, device="cpu", dtype="float32", mode="eager")
    params = dict(toy.model.named_parameters())
    weights = {n: Int8Weight.quantize(params[n].detach()) for n in quantize_candidates(toy.model)}
    assert sorted(toy.model.use_quantized(weights)) == sorted(weights)
