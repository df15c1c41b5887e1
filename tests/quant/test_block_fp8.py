"""Block-scaled FP8 checkpoints (transformers' "fp8" with `weight_scale_inv`, compressed-tensors
strategy "block"): the block format itself, the round trip through the loader for the three
families (re-rounded per output channel), the config's and the reader's named errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from fp8_helpers import fp8_sources

from dlmrt.errors import CheckpointError
from dlmrt.formats.block_fp8 import block_grid, dequantize_blocks, quantize_blocks, to_per_channel
from dlmrt.formats.fp8 import FP8, FP8_MAX
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.loading.policy import classify
from dlmrt.loading.quant_config import read_quant_config
from dlmrt.quant.writer import write_fp8_checkpoint

CPU = torch.device("cpu")
BLOCK = (16, 32)  # tiny models: several blocks a weight, partial ones at the edges


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    return fp8_sources(tmp_path_factory, "blocksrc")


def test_block_quantization_scales_each_tile_by_its_own_amax():
    w = torch.randn(2, 40, 70) * torch.linspace(0.01, 10, 70)  # 40 x 70: partial tiles both ways
    codes, scale = quantize_blocks(w, BLOCK)
    assert codes.dtype == FP8 and scale.shape == block_grid(tuple(w.shape), BLOCK) == (2, 3, 3)
    for i in range(3):
        for j in range(3):
            tile = w[:, i * 16 : (i + 1) * 16, j * 32 : (j + 1) * 32]
            want = tile.abs().amax(dim=(-2, -1)) / FP8_MAX
            assert torch.allclose(scale[:, i, j], want)
            got = codes[:, i * 16 : (i + 1) * 16, j * 32 : (j + 1) * 32].float()
            assert torch.equal(got.abs().amax(dim=(-2, -1)), torch.full((2,), FP8_MAX))
    err = (dequantize_blocks(codes, scale, BLOCK) - w).abs()
    half_step = w.abs() / 16 + _expand_like(scale, w) * 2**-9  # half an e4m3 step (+ subnormals)
    assert (err <= half_step).all()


def _expand_like(scale, w):
    return scale.repeat_interleave(16, -2).repeat_interleave(32, -1)[
        ..., : w.shape[-2], : w.shape[-1]
    ]


def test_per_channel_re_rounding_is_exact_when_the_scales_agree_and_bounded_otherwise():
    w = torch.randn(32, 64)
    w[:, 0] = w[:, 32] = 10.0  # every tile's amax, and every row's: one scale everywhere
    codes, scale = quantize_blocks(w, BLOCK)
    fp8 = to_per_channel(codes, scale, BLOCK)
    assert torch.equal(fp8.qweight.view(torch.uint8), codes.view(torch.uint8))
    assert torch.allclose(fp8.scale, torch.full((32,), 10.0 / FP8_MAX))
    w = torch.randn(32, 64) * torch.linspace(0.1, 10, 64)  # blocks of a row scaled differently
    codes, scale = quantize_blocks(w, BLOCK)
    fp8, deq = to_per_channel(codes, scale, BLOCK), dequantize_blocks(codes, scale, BLOCK)
    assert not torch.equal(fp8.dequantize(torch.float32), deq)
    err = (fp8.dequantize(torch.float32) - deq).abs()
    assert (err <= deq.abs() / 16 + fp8.scale[:, None] * 2**-9).all()  # half a step of the row's


@pytest.mark.parametrize("family", ["qwen", "llada2", "dg"])
@pytest.mark.parametrize("fmt", ["fp8", "compressed-tensors"])
def test_block_checkpoint_loads_as_its_per_channel_re_rounding(
    sources, tmp_path, family, fmt, caplog
):
    src = sources[family]
    ref = load_checkpoint(src, torch.float32, CPU).model.state_dict()
    out = write_fp8_checkpoint(src, tmp_path / "fp8", fmt=fmt, strategy="block", block=BLOCK)
    qc = read_quant_config(out, json.loads((out / "config.json").read_text()))
    assert qc.strategy == "block" and qc.block == BLOCK
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        ckpt = load_checkpoint(out, torch.float32, CPU)
    assert sum("re-rounded per output channel" in r.message for r in caplog.records) == 1
    tied = {n for n in ref if n == "lm_head.weight" and family == "dg"}
    assert set(ckpt.quantized) == {n for n in ref if classify(n)[0]} - tied
    got = ckpt.model.state_dict()
    for name, w in ckpt.quantized.items():
        want = to_per_channel(*quantize_blocks(ref[name], BLOCK), BLOCK)
        assert torch.equal(w.qweight.view(torch.uint8), want.qweight.view(torch.uint8)), name
        assert torch.equal(w.scale, want.scale), name
        assert torch.equal(got[name], want.dequantize(torch.float32)), name
        rel = (got[name] - ref[name]).norm() / ref[name].norm()
        assert rel < 0.06, (name, rel)  # two e4m3 roundings of a random weight: ~4%


def test_block_checkpoint_generates(sources, tmp_path):
    from dlmrt import LLM

    out = write_fp8_checkpoint(
        sources["qwen"], tmp_path / "fp8", fmt="fp8", strategy="block", block=BLOCK
    )
    kw = {"max_new_tokens": 8}
    got = LLM(str(out), device="cpu", dtype="float32").generate([5, 6, 7], **kw).token_ids
    none = LLM(str(out), device="cpu", dtype="float32", quantization="none")
    assert len(got) == 8 and got == none.generate([5, 6, 7], **kw).token_ids


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"weight_block_size": [128]}, "'weight_block_size' must be two positive integers"),
        ({"weight_block_size": None}, "'weight_block_size' must be two positive integers"),
        ({"activation_scheme": "static"}, "activation_scheme 'static' is not supported"),
        ({"fmt": "e5m2"}, "FP8 fmt 'e5m2' is not supported"),
        ({"modules_to_not_convert": "lm_head"}, "'modules_to_not_convert' must be a list"),
    ],
)
def test_finegrained_config_errors_name_the_field(tmp_path, edit, message):
    qc = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    } | edit
    with pytest.raises(CheckpointError, match=message):
        read_quant_config(tmp_path, {"quantization_config": qc})


def test_a_block_scale_of_the_wrong_shape_is_named(sources, tmp_path):
    from safetensors.torch import load_file, save_file

    out = write_fp8_checkpoint(
        sources["qwen"], tmp_path / "fp8", fmt="fp8", strategy="block", block=BLOCK
    )
    tensors = load_file(str(out / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight_scale_inv"
    tensors[name] = tensors[name][:, :1].contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"scale '{name}' has shape"):
        load_checkpoint(out, torch.float32, CPU)


def test_writer_refuses_blocks_outside_their_formats(sources, tmp_path):
    with pytest.raises(ValueError, match="ModelOpt has no blocks"):
        write_fp8_checkpoint(sources["qwen"], tmp_path / "a", fmt="modelopt", strategy="block")
    with pytest.raises(ValueError, match="'fp8' is block-scaled only"):
        write_fp8_checkpoint(sources["qwen"], tmp_path / "b", fmt="fp8", strategy="channel")
