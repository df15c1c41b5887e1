"""`impls/deepgemm_install.py`: a layer's bf16 projections go to DeepGEMM only where it is chosen
at the block rows, keeping their parameters (and state-dict names); without the library nothing
is looked at. CPU: the library and its per-shape choice are stand-ins (`test_deepgemm.py` has
the library's own contract)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_deepgemm import fake_library
from torch import nn

from dlmrt.impls.deepgemm_install import BlockRowsGemm, DeepGemmLinear, install_deepgemm
from dlmrt.impls.dense import StackedGateUp, StackedProjection
from dlmrt.ops import deepgemm


class _Layer(nn.Module):
    def __init__(self, hidden: int = 16, inter: int = 32) -> None:
        super().__init__()
        self.self_attn, self.mlp = nn.Module(), nn.Module()
        self.self_attn.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.self_attn.qkv = StackedProjection(torch.randn(3 * hidden, hidden))
        self.mlp.down_proj = nn.Linear(inter, hidden, bias=False)
        self.mlp.gate_up = StackedGateUp(torch.randn(2 * inter, hidden), "silu")


def _model(dtype=torch.bfloat16) -> nn.Module:
    model = nn.Module()
    model.cfg = SimpleNamespace(block_size=8)
    model.model = nn.Module()
    model.model.layers = nn.ModuleList([_Layer(), _Layer()]).to(dtype)
    for layer in model.model.layers:  # the plain objects' weights too
        layer.self_attn.qkv.weight = layer.self_attn.qkv.weight.to(dtype)
        layer.mlp.gate_up.weight = layer.mlp.gate_up.weight.to(dtype)
    return model


@pytest.fixture
def library(monkeypatch):
    """A stand-in deep_gemm whose GEMM wins for every shape but o_proj's (N = K = 16)."""
    lib = fake_library()
    monkeypatch.setattr(deepgemm, "library", lambda: lib)
    seen = []

    def chosen(x, w):
        seen.append((x.shape[0], *w.shape))
        return tuple(w.shape) != (16, 16)

    monkeypatch.setattr(deepgemm, "chosen", chosen)
    return seen


def test_the_projections_where_it_wins_move_and_keep_their_parameters(library):
    model = _model()
    names = sorted(model.state_dict())
    o_proj = model.model.layers[0].self_attn.o_proj
    down = model.model.layers[0].mlp.down_proj.weight
    calls = []  # a row-parallel linear's all-reduce hook (distributed/shard.py) must follow it
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: calls.append(m))
    assert install_deepgemm(model) == 2 * 3  # per layer: qkv, gate_up, down_proj (not o_proj)
    layer = model.model.layers[0]
    assert layer.self_attn.o_proj is o_proj  # it lost: untouched
    assert isinstance(layer.mlp.down_proj, DeepGemmLinear) and layer.mlp.down_proj.weight is down
    for stacked in (layer.self_attn.qkv, layer.mlp.gate_up):
        assert isinstance(stacked.gemm, BlockRowsGemm) and stacked.gemm.rows == 8
    assert sorted(model.state_dict()) == names
    assert {rows for rows, *_ in library} == {8}  # timed at the block rows
    x = torch.randn(8, 32, dtype=torch.bfloat16)
    out = layer.mlp.down_proj(x)
    assert calls == [layer.mlp.down_proj]
    assert torch.allclose(out.float(), F.linear(x, down).float(), rtol=1e-2, atol=1e-2)


def test_only_the_block_rows_run_on_it(monkeypatch):
    ran = []
    monkeypatch.setattr(deepgemm, "fits", lambda x, w: True)
    monkeypatch.setattr(deepgemm, "gemm", lambda x, w: ran.append(x.shape[0]) or F.linear(x, w))
    gemm, w = BlockRowsGemm(8), torch.randn(4, 16)
    for rows in (8, 3, 64):  # a round's rows, then a prefill's
        assert torch.equal(gemm(torch.ones(rows, 16), w), F.linear(torch.ones(rows, 16), w))
    assert ran == [8]


def test_quantized_fused_or_float32_projections_are_left_alone(library):
    model = _model(torch.float32)
    assert install_deepgemm(model) == 0 and library == []
    model = _model()
    model.model.layers[0].mlp.down_proj = nn.Linear(32, 16, bias=True).to(torch.bfloat16)
    model.model.layers[0].mlp.gate_up = object()  # a fused or quantized first half
    assert install_deepgemm(model) == 2 * 3 - 2


def test_without_the_library_nothing_is_looked_at(monkeypatch):
    monkeypatch.setattr(deepgemm, "library", lambda: None)
    monkeypatch.setattr(deepgemm, "chosen", lambda x, w: pytest.fail("timed without a library"))
    model = _model()
    assert install_deepgemm(model) == 0
    assert type(model.model.layers[0].mlp.down_proj) is nn.Linear
    assert model.model.layers[0].self_attn.qkv.gemm is F.linear
