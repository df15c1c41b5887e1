"""activations="nvfp4": W4A4 emulation of an NVFP4 checkpoint's experts (CPU: the twin path)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nvfp4_helpers import nvfp4_sources
from safetensors.torch import load_file, save_file

from dlmrt.config import EngineConfig
from dlmrt.formats.nvfp4 import BLOCK, E2M1_MAX, E2M1_VALUES, encode, quantize_nvfp4
from dlmrt.impls.experts import Nvfp4Experts
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.ops import reference
from dlmrt.ops.nvfp4 import act_quantizers, fake_quant_act, moe_mlp_nvfp4
from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint

CPU = torch.device("cpu")


def _encoded(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The table-based quantizer's values (formats/nvfp4.py: round_e2m1 with its tie rule)."""
    amax16 = x.float().abs().unflatten(-1, (-1, BLOCK)).amax(dim=-1)
    return encode(x, amax16 / E2M1_MAX, scale.float()).dequantize(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quant_act_equals_the_table_quantizer_ties_included(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 64, generator=gen) * torch.rand(7, 1, generator=gen) * 5
    # one block of every E2M1 value, its midpoints (the ties) and values just off them, at a
    # block scale of exactly 1 (amax 6, global 1/448: block scale 6/6 * 448 = 448 -> 1 * g * 448)
    mags = list(E2M1_VALUES) + [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.0 - 2**-10, 5.0 + 2**-10]
    grid = torch.tensor(mags + [-m for m in mags])
    grid = torch.cat([grid, torch.full((48 - grid.numel(),), 6.0)]).reshape(1, 48)
    x = torch.cat([x[:, :48], grid, torch.zeros(1, 48)]).to(dtype)
    scale = torch.tensor(6.0 / (6 * 448))
    got = fake_quant_act(x, scale)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, _encoded(x, scale), rtol=0, atol=0)
    ties = got[7, : len(mags)].float()  # the tie of 2.5 goes to 2 (code 4), 5.0 to 4 (code 6)
    assert ties[len(E2M1_VALUES) :].tolist()[:7] == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert not torch.equal(got[:7], x[:7])


def _moe(hidden: int = 32, inter: int = 48, experts: int = 4):
    gen = torch.Generator().manual_seed(5)
    gate, up = (torch.randn(experts, inter, hidden, generator=gen) / 4 for _ in range(2))
    down = torch.randn(experts, hidden, inter, generator=gen) / 4
    ws = [quantize_nvfp4(w) for w in (gate, up, down)]
    scales = [torch.tensor(s) for s in (0.004, 0.005, 0.003)]  # amax 8 .. 13.4: nothing clips
    ws = [type(w)(w.packed, w.block_scale, w.global_scale, s) for w, s in zip(ws, scales)]
    x = torch.randn(6, hidden, generator=gen)
    index = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2], [1, 3]])
    return x, torch.rand(6, 2, generator=gen), index, ws


def test_moe_mlp_nvfp4_with_act_scales_quantizes_both_gemm_inputs():
    x, weights, index, (g, u, d) = _moe()
    sx, sh = act_quantizers(g, u, d)
    assert sx == 0.005 and sh == 0.003  # gate and up share x: the larger scale
    got = moe_mlp_nvfp4(x, weights, index, g, u, d, "silu", act_scales=(sx, sh))
    deq = [w.dequantize(x.dtype) for w in (g, u, d)]
    xq = fake_quant_act(x, sx)
    want = reference.moe_mlp(
        xq, weights, index, tuple(deq[:2]), deq[2], "silu", None, lambda h: fake_quant_act(h, sh)
    )
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    w4a16 = moe_mlp_nvfp4(x, weights, index, g, u, d, "silu")
    assert not torch.equal(got, w4a16)
    err = (got - w4a16).norm() / w4a16.norm()  # the same layer with 4-bit inputs: close, not equal
    assert 0.01 < err < 0.25, err


def test_act_quantizers_name_a_missing_input_scale():
    x, weights, index, (g, u, d) = _moe()
    bare = type(d)(d.packed, d.block_scale, d.global_scale)
    with pytest.raises(ValueError, match="down projection's NVFP4 weight has no input scale"):
        act_quantizers(g, u, bare)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("w4a4")
    src = nvfp4_sources(root / "src")
    amax = lambda name: torch.tensor(2.0 + len(name) % 3)  # noqa: E731  (a known amax per weight)
    return {
        f"{fam}-{fmt}": write_nvfp4_checkpoint(
            src[fam], root / f"{fam}-{fmt}", fmt=fmt, input_amax=amax
        )
        for fam in ("llada2", "dg")
        for fmt in ("modelopt", "compressed-tensors")
    } | {"plain": src["llada2"]}


@pytest.mark.parametrize("name", ["llada2-modelopt", "llada2-compressed-tensors", "dg-modelopt"])
def test_loaded_input_scales_are_the_written_ones_and_generation_runs(quantized, name):
    path = quantized[name]
    ckpt = load_checkpoint(path, torch.float32, CPU, activations="nvfp4")
    experts = [
        m.impl for m in ckpt.model.modules() if isinstance(getattr(m, "impl", None), Nvfp4Experts)
    ]
    assert experts and all(impl.act_scales is not None for impl in experts)
    stored = load_file(str(path / "model.safetensors"))
    key = "input_scale" if "modelopt" in name else "input_global_scale"
    scales = {n: v if key == "input_scale" else 1.0 / v for n, v in stored.items() if key in n}
    down = max(
        v.max() for n, v in scales.items() if ".0.mlp" not in n and "down" in n and "layers.1." in n
    )
    torch.testing.assert_close(experts[0].act_scales[1], down, rtol=1e-6, atol=0)
    from dlmrt import LLM

    w4a4 = LLM(path, device="cpu", dtype="float32", activations="nvfp4", mode="eager")
    out = w4a4.generate([5, 6, 7, 8], max_new_tokens=8, ignore_eos=True)
    assert out.num_generated_tokens == 8


def test_w4a4_errors_name_what_is_missing(quantized, tmp_path):
    with pytest.raises(ValueError, match="checkpoint has no NVFP4 weights"):
        load_checkpoint(quantized["plain"], torch.float32, CPU, activations="nvfp4")
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in quantized["llada2-modelopt"].iterdir():
        (bare / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(bare / "model.safetensors"))
    save_file(
        {n: t for n, t in tensors.items() if "input_scale" not in n},
        str(bare / "model.safetensors"),
    )
    load_checkpoint(bare, torch.float32, CPU)  # W4A16 needs no input scales
    with pytest.raises(ValueError, match="gate projection's NVFP4 weight has no input scale"):
        load_checkpoint(bare, torch.float32, CPU, activations="nvfp4")
    with pytest.raises(ValueError, match="activations: expected one of none, nvfp4"):
        EngineConfig(activations="fp4")
