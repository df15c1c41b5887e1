"""Dense NVFP4 MLPs (QwenDLM, LLaDA2's first dense layer, DiffusionGemma's GeGLU) as `Nvfp4Linear`s:
installed as on CUDA (`use_quantized`) and under W4A4 emulation on the CPU (activations="nvfp4"); the
CPU without emulation still dequantizes them at load. CPU: the twins."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from nvfp4_helpers import nvfp4_sources
from safetensors.torch import load_file, save_file

from dlmrt import LLM
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.formats.nvfp4 import quantize_nvfp4
from dlmrt.impls import dense_install
from dlmrt.impls.dense import SeparateGateUp, StackedGateUp
from dlmrt.impls.install import Installer
from dlmrt.impls.nvfp4_linear import Nvfp4Linear
from dlmrt.loading import placement
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.models.layers import GeGLU, SwiGLU
from dlmrt.ops import reference
from dlmrt.ops.nvfp4 import fake_quant_act
from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint

CPU = torch.device("cpu")
DENSE = {"qwen": [0, 1], "llada2": [0], "dg": [0, 1, 2, 3, 4]}  # layers with an NVFP4 dense MLP
PROMPT, KW = [5, 6, 7, 8, 9], dict(max_new_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    """Each family in NVFP4 with input scales (a known amax per weight), and qwen without."""
    root = tmp_path_factory.mktemp("nvfp4dense")
    src = nvfp4_sources(root / "src")
    amax = lambda name: torch.tensor(2.0 + len(name) % 3)  # noqa: E731
    out = {f: write_nvfp4_checkpoint(src[f], root / f, input_amax=amax) for f in src}
    return out | {"bare": write_nvfp4_checkpoint(src["qwen"], root / "bare")}


def _mlps(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers' dense MLPs (not LLaDA2's shared experts, also a SwiGLU)."""
    return [layer.mlp for layer in model.model.layers if type(layer.mlp) in (SwiGLU, GeGLU)]


def _twin(mlp, x: torch.Tensor, scales=None) -> torch.Tensor:
    """The dense MLP from the ops' twins: dequantized gate|up, the activation, dequantized down;
    `scales` (x's, the hidden's): both GEMM inputs fake-quantized first."""
    act = _gelu_mul if type(mlp) is GeGLU else reference.silu_mul
    quant = (lambda t, i: fake_quant_act(t, scales[i])) if scales else (lambda t, i: t)  # noqa: E731
    h = act(F.linear(quant(x, 0), mlp.gate_up.linear.weight.dequantize(x.dtype)))
    return F.linear(quant(h, 1), mlp.down_proj.weight.dequantize(x.dtype))


def _gelu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def _input_scales(fp8: dict, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(max(gate, up), down) input scales of a layer's dense MLP, as the loader read them."""
    s = {
        p: fp8[f"model.layers.{layer}.mlp.{p}_proj.weight"].input_scale
        for p in ("gate", "up", "down")
    }
    return torch.maximum(s["gate"], s["up"]), s["down"]


@pytest.mark.parametrize("family", ["qwen", "llada2", "dg"])
def test_emulation_installs_the_dense_mlps_and_quantizes_both_gemm_inputs(ckpts, family):
    ckpt = load_checkpoint(ckpts[family], torch.float32, CPU, activations="nvfp4")
    plain = load_checkpoint(ckpts[family], torch.float32, CPU)  # dequantized at load
    layers = ckpt.model.model.layers
    for i, layer in enumerate(layers):
        mlp = layer.mlp
        if i not in DENSE[family]:
            assert not isinstance(mlp, (SwiGLU, GeGLU))
            continue
        assert isinstance(mlp.gate_up.linear, Nvfp4Linear) and isinstance(
            mlp.down_proj, Nvfp4Linear
        )
        assert mlp.gate_proj.weight.numel() == 0 and mlp.up_proj.weight.numel() == 0  # bf16 freed
        assert (
            mlp.gate_up.linear.weight.per_row
            and mlp.gate_up.linear.weight.packed.dtype == torch.uint8
        )
        sx, sh = _input_scales(plain.quantized, i)
        assert mlp.gate_up.linear.act_scale == sx and mlp.down_proj.act_scale == sh
        x = torch.randn(
            6, mlp.gate_up.linear.weight.shape[1], generator=torch.Generator().manual_seed(i)
        )
        got = mlp(x)
        assert torch.equal(got, _twin(mlp, x, (sx, sh)))
        w4a16 = plain.model.model.layers[i].mlp(x)  # the MLP dequantized at load
        assert torch.equal(_twin(mlp, x), w4a16)
        assert (got - w4a16).norm() > 1e-3 * w4a16.norm()  # 4-bit inputs: not W4A16's output
    # only the dense MLPs: never attention, the ORL adapter, shared experts, self-conditioning
    dense = {n for n, m in ckpt.model.named_modules() if isinstance(m, Nvfp4Linear)}
    assert dense == {
        f"model.layers.{i}.mlp.{p}" for i in DENSE[family] for p in ("gate_up.linear", "down_proj")
    }


def test_emulated_generation_equals_fake_quant_hooks_on_the_dequantized_model(ckpts):
    """QwenDLM, activations="nvfp4": the tokens of the dequantized model whose dense MLP inputs
    are fake-quantized by hooks (x with max(gate, up)'s scale, SiLU·up with down's)."""
    path = ckpts["qwen"]
    w4a4 = LLM(path, device="cpu", dtype="float32", activations="nvfp4", mode="eager")
    hooked = LLM(path, device="cpu", dtype="float32", mode="eager")
    fp8 = load_checkpoint(path, torch.float32, CPU).quantized
    for i, mlp in enumerate(_mlps(hooked.model)):
        sx, sh = _input_scales(fp8, i)
        assert not hasattr(mlp.gate_up, "linear") and type(mlp.down_proj) is torch.nn.Linear
        mlp.register_forward_pre_hook(lambda m, a, s=sx: (fake_quant_act(a[0], s),))
        mlp.down_proj.register_forward_pre_hook(lambda m, a, s=sh: (fake_quant_act(a[0], s),))
    got = w4a4.generate(PROMPT, **KW).token_ids
    assert got == w4a4.generate(PROMPT, **KW).token_ids  # deterministic
    assert got == hooked.generate(PROMPT, **KW).token_ids


@pytest.mark.parametrize("family", ["qwen", "llada2", "dg"])
def test_without_emulation_the_cpu_dequantizes_and_w4a16_installed_gives_its_tokens(
    ckpts, monkeypatch, caplog, family
):
    """The CPU keeps today's path (plain linears holding the dequantized weights); installed as on
    CUDA (`use_quantized`), the W4A16 twin decodes the same tokens."""
    plain = LLM(ckpts[family], device="cpu", dtype="float32", mode="eager")
    assert not any(isinstance(m, Nvfp4Linear) for m in plain.model.modules())
    for mlp in _mlps(plain.model):
        assert not hasattr(mlp.gate_up, "linear") and type(mlp.down_proj) is torch.nn.Linear
        assert mlp.gate_proj.weight.dtype == torch.float32 and mlp.gate_proj.weight.numel() > 0
    monkeypatch.setattr(placement, "has_quantized_kernels", lambda device: True)  # as on CUDA
    with caplog.at_level(logging.DEBUG, logger="dlmrt"):
        installed = LLM(ckpts[family], device="cpu", dtype="float32", mode="eager")
    assert "nvfp4 model.layers.0.mlp: NVFP4 weight-only W4A16 (dense MLP)" in caplog.text
    dense = [m for m in installed.model.modules() if isinstance(m, Nvfp4Linear)]
    assert len(dense) == 2 * len(DENSE[family]) and all(m.act_scale is None for m in dense)
    kw = KW | ({"rng": "counter"} if family == "dg" else {})
    prompt = [p % 90 + 6 for p in PROMPT]
    assert installed.generate(prompt, **kw).token_ids == plain.generate(prompt, **kw).token_ids


@pytest.mark.parametrize(
    "drop, named", [("", "gate_proj"), ("up_proj", "up_proj"), ("down_proj", "down_proj")]
)
def test_emulation_names_the_dense_weight_without_an_input_scale(ckpts, tmp_path, drop, named):
    path = ckpts["bare"] if not drop else tmp_path / "partial"
    if drop:
        path.mkdir()
        for f in ckpts["qwen"].iterdir():
            (path / f.name).write_bytes(f.read_bytes())
        tensors = load_file(str(path / "model.safetensors"))
        gone = f"model.layers.1.mlp.{drop}.input_scale"
        save_file({n: t for n, t in tensors.items() if n != gone}, str(path / "model.safetensors"))
    load_checkpoint(path, torch.float32, CPU)  # W4A16 needs no input scales
    layer = 0 if not drop else 1
    with pytest.raises(
        ValueError,
        match=f"dense NVFP4 weight model.layers.{layer}.mlp.{named}"
        r".weight has no input scale",
    ):
        load_checkpoint(path, torch.float32, CPU, activations="nvfp4")


def test_an_mlp_partly_on_meta_stays_unfused():
    """A deferred load keeps only the NVFP4 projections on meta: with gate NVFP4 and up not,
    fusing would join a meta and an allocated weight; the MLP stays unfused instead."""
    mlp = SwiGLU(16, 32)
    mlp.gate_proj.weight = torch.nn.Parameter(torch.empty(32, 16, device="meta"))
    mlp.fuse()
    assert isinstance(mlp.gate_up, SeparateGateUp)
    assert mlp.gate_proj.weight.is_meta and not mlp.up_proj.weight.is_meta
    mlp.gate_proj.weight = torch.nn.Parameter(torch.randn(32, 16))
    mlp.fuse()  # one device again: fused
    assert isinstance(mlp.gate_up, StackedGateUp)


def test_an_mlp_with_an_fp8_down_is_not_an_nvfp4_mlp():
    """gate/up NVFP4 beside an FP8 down: the NVFP4 builder declines the MLP (all three stay for
    the loader to dequantize) instead of building an Nvfp4Linear over the FP8 weight."""
    mlp = SwiGLU(16, 32)
    model = SimpleNamespace(embed_table=torch.zeros(4, 16))
    weights = {
        "mlp.gate_proj.weight": quantize_nvfp4(mlp.gate_proj.weight.detach()),
        "mlp.up_proj.weight": quantize_nvfp4(mlp.up_proj.weight.detach()),
        "mlp.down_proj.weight": quantize_per_channel(mlp.down_proj.weight.detach()),
    }
    ins = Installer(model, weights, rows=16, emulate=True)
    assert dense_install.nvfp4_gated_mlp(ins, "mlp", mlp, None) == []
    assert isinstance(mlp.gate_up, SeparateGateUp) and isinstance(mlp.down_proj, torch.nn.Linear)
