"""FP8 execution on the CPU: what `use_quantized` installs, the twins' numerics, the FP8 KV arena."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint
from fp8_helpers import quantize_model

from dlmrt import LLM
from dlmrt.attention import AttnContext
from dlmrt.engine.kv_cache import arena_dtype
from dlmrt.formats.fp8 import FP8, quantize_per_channel, quantize_rows
from dlmrt.impls.fp8_linear import Fp8Linear
from dlmrt.impls.norms import fp8_out_norm
from dlmrt.loading.placement import install, quantize_candidates
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops import reference
from dlmrt.ops.fp8 import silu_mul_fp8


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return {
        "qwen": write_checkpoint(root / "q", residual=residual_config(), vocab_size=320),
        "llada": write_llada2_checkpoint(root / "l", vocab_size=320),
    }


def test_quantize_per_channel_round_trip_error_is_bounded():
    w = torch.randn(48, 80) * torch.rand(48, 1) * 10
    q = quantize_per_channel(w)
    assert q.qweight.dtype == FP8 and q.scale.shape == (48,)
    err = (q.dequantize(torch.float32) - w).abs() / w.abs().amax(1, keepdim=True)
    assert err.max() <= 2**-4 + 1e-6  # half an e4m3 step at the top of the range
    zero = quantize_per_channel(torch.zeros(3, 16))
    assert zero.dequantize(torch.float32).eq(0).all()


def test_twins_are_quantize_after_the_plain_op():
    x, r = torch.randn(5, 64), torch.randn(5, 64)
    w = torch.rand(64) + 0.5
    act, total = fp8_ops.add_rms_norm_fp8(x, r, w, 1e-6)
    plain, plain_total = reference.add_rms_norm(x, r, w, 1e-6)
    assert total.equal(plain_total) and act.q.equal(quantize_rows(plain).q)
    gu = torch.randn(5, 96)
    assert fp8_ops.silu_mul_fp8(gu).q.equal(quantize_rows(reference.silu_mul(gu)).q)
    wq = quantize_per_channel(torch.randn(32, 64))
    y = fp8_ops.fp8_linear(act, wq, torch.float32)
    expect = act.dequantize(torch.float32) @ wq.dequantize(torch.float32).t()
    torch.testing.assert_close(y, expect)


@pytest.mark.parametrize("family", ["qwen", "llada"])
def test_use_fp8_installs_the_projections_the_policy_names(ckpts, family):
    model = LLM(ckpts[family], device="cpu").engine.model
    fp8, left = quantize_model(model)
    layer = model.model.layers[0]
    if family == "qwen":
        assert (
            isinstance(layer.self_attn.qkv, Fp8Linear)
            and layer.self_attn.q_proj.weight.numel() == 0
        )
        assert isinstance(layer.mlp.gate_up.linear, Fp8Linear)
        assert layer.mlp.gate_up.activation is silu_mul_fp8  # quantizes down's input
        assert layer.post_attention_layernorm.impl is fp8_out_norm
    else:
        assert isinstance(layer.attention.query_key_value, Fp8Linear)
        moe = model.model.layers[-1].mlp.experts
        assert moe.gate_proj.dtype == FP8 and moe.impl.scales is not None
    assert layer.input_layernorm.impl is fp8_out_norm and isinstance(model.lm_head, Fp8Linear)
    out = layer.self_attn.o_proj if family == "qwen" else layer.attention.dense
    assert isinstance(out, Fp8Linear)  # the attention output: quantized before its GEMM
    kept = {n.split(".", 3)[-1] for n in left}  # shared experts stay bf16
    assert not any(n.startswith(("mlp.experts.", "self_attn.", "attention.")) for n in kept)
    assert not any("adapter" in n for n in fp8)


@pytest.mark.parametrize("family", ["qwen", "llada"])
def test_fp8_forward_tracks_the_dequantized_model(ckpts, family):
    """Against the bf16 model holding the dequantized weights, only activation rounding differs."""
    llm = LLM(ckpts[family], device="cpu")
    model = llm.engine.model
    ref = copy.deepcopy(model)
    fp8, _ = quantize_model(model)
    with torch.no_grad():
        for name, w in fp8.items():
            ref.get_parameter(name).copy_(w.dequantize(torch.float32))
    ids, pos = torch.randint(0, 300, (16,)), torch.arange(16)
    a = model(ids, AttnContext(pos, 8, None, None))
    b = ref(ids, AttnContext(pos, 8, None, None))
    assert ((a - b).norm() / b.norm()) < 0.5  # tiny random models amplify; the demo test is tight
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.5
    out = llm.generate("hello", max_new_tokens=16, ignore_eos=True)
    assert len(out.token_ids) == 16


def test_kv_cache_dtype_names_and_fp8_arena(ckpts):
    assert arena_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert arena_dtype("fp8", torch.float32) == FP8
    with pytest.raises(ValueError, match="kv_cache_dtype='int4'.*auto, fp8"):
        arena_dtype("int4", torch.float32)
    llm = LLM(ckpts["qwen"], device="cpu")
    from dlmrt.engine.block.engine import BlockEngine

    e = llm.engine
    llm.engine = BlockEngine(e.model, e.device, e.dtype, e.mode, kv_cache_dtype="fp8")
    out = llm.generate("hello", max_new_tokens=16, ignore_eos=True)
    arena = llm.engine.workspace.arena
    assert len(out.token_ids) == 16
    assert arena.k.dtype == arena.v.dtype == FP8 and arena.k.view(torch.uint8).any()


def test_write_rows_rounds_into_an_fp8_arena():
    dest = torch.zeros(2, 6, 4, dtype=FP8)
    src = torch.randn(2, 3, 4)
    reference.write_rows(dest, 1, torch.tensor([1, 3, 5]), src)
    assert dest[:, [1, 3, 5]].float().equal(src.to(FP8).float())
    assert dest[:, [0, 2, 4]].float().eq(0).all()
    picked = reference.select_rows(dest, 1, torch.tensor([5, 1]))
    assert picked.dtype == FP8 and picked.float().equal(dest[:, [5, 1]].float())


def test_diffusion_gemma_runs_every_dense_projection_and_its_tied_head_in_fp8(tmp_path_factory):
    """q|k|v (full layers q|k), o, the dense GeGLU and the tied LM head (an FP8 copy: the
    embedding stays for the lookups) as Fp8Linears; the forward tracks the dequantized model."""
    from dg_helpers import tiny_checkpoint

    path, _ = tiny_checkpoint(tmp_path_factory)
    llm = LLM(path, device="cpu")
    model = llm.engine.model
    assert model.lm_head.weight is model.embed_table  # tied in the tiny checkpoint
    embed = model.embed_table.detach().clone()
    ref = copy.deepcopy(model)
    fp8, left = quantize_model(model)
    for layer in model.model.layers:
        attn = layer.self_attn
        assert isinstance(attn.qkv, Fp8Linear) and attn.q_proj.weight.numel() == 0
        assert isinstance(attn.o_proj, Fp8Linear) and isinstance(
            layer.mlp.gate_up.linear, Fp8Linear
        )
        assert isinstance(layer.mlp.down_proj, Fp8Linear)
    assert isinstance(model.lm_head, Fp8Linear) and "lm_head.weight" not in left
    assert torch.equal(model.embed_table, embed)  # the embedding itself is not quantized
    with torch.no_grad():
        for name, w in fp8.items():
            ref.get_parameter(name).copy_(w.dequantize(ref.get_parameter(name).dtype))
    h = torch.randn(6, model.cfg.hidden_size)
    mine, theirs = model.model.layers[-1], ref.model.layers[-1]  # a full layer: q|k only
    pairs = [(model.lm_head(h), ref.lm_head(h)), (mine.mlp(h), theirs.mlp(h))]
    pairs += list(zip(mine.self_attn._qkv(h), theirs.self_attn._qkv(h)))
    for a, b in pairs:  # only the activations' row quantization differs
        assert a.shape == b.shape and ((a - b).norm() / b.norm()) < 0.1
    out = llm.generate("hello", max_new_tokens=16)
    assert out.token_ids


def _dense_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's non-FP8 tensors, each storage counted once (fused views share one)."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        storage = t.untyped_storage()
        if t.dtype != FP8 and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


@pytest.mark.parametrize("family", ["qwen", "llada"])
def test_installing_fp8_frees_the_dense_originals(ckpts, family):
    """What runs FP8 leaves no dense copy behind (the FP8 codes wait in host memory until
    installed, `placement.host_copy`), so an FP8 model holds less than its dense one."""
    model = LLM(ckpts[family], device="cpu").engine.model
    before = _dense_bytes(model)
    fp8 = quantize_candidates(model)
    assert all(w.qweight.device.type == "cpu" for w in fp8.values())
    declined = set(install(model, fp8)[1])
    installed = {n: w for n, w in fp8.items() if n not in declined}
    assert installed
    dense = sum(w.qweight.numel() for w in installed.values()) * 4  # fp32 checkpoint weights
    scales = sum(w.scale.numel() for w in installed.values()) * 4  # the FP8 scales stay fp32
    assert _dense_bytes(model) <= before - dense + scales


def test_quantizing_in_chunks_gives_the_same_codes(monkeypatch):
    """Per-channel quantization of a stack done a few channels at a time (the load's memory cap)
    is bit for bit the whole-tensor formula."""
    from dlmrt.formats import fp8 as fp8_mod

    w = torch.randn(5, 37, 48) * torch.rand(5, 37, 1) * 10
    whole = fp8_mod.quantize_per_channel(w)
    monkeypatch.setattr(fp8_mod, "CHUNK", 100)  # 2 channels of 48 per step
    chunked = fp8_mod.quantize_per_channel(w)
    scale = (w.abs().amax(dim=-1) / fp8_mod.FP8_MAX).clamp_min(fp8_mod.MIN_SCALE)
    codes = (w / scale.unsqueeze(-1)).clamp(-fp8_mod.FP8_MAX, fp8_mod.FP8_MAX).to(FP8)
    for q in (whole, chunked):
        assert torch.equal(q.qweight.view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(q.scale, scale) and q.qweight.shape == w.shape


def test_a_replaced_linear_keeps_its_forward_hooks(ckpts):
    """Tensor parallelism's all-reduce hangs on the row-parallel linears as a forward hook
    (distributed/shard.py): the FP8 linear that replaces one keeps it."""
    model = LLM(ckpts["qwen"], device="cpu").engine.model
    calls = []
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(lambda m, i, o: calls.append(1))
        layer.mlp.down_proj.register_forward_hook(lambda m, i, o: calls.append(2))
    quantize_model(model)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.o_proj, Fp8Linear) and isinstance(
        layer.mlp.down_proj, Fp8Linear
    )
    layer.self_attn.o_proj(torch.randn(3, layer.self_attn.o_proj.qweight.shape[1]))
    layer.mlp.down_proj(torch.randn(3, layer.mlp.down_proj.qweight.shape[1]))
    assert calls == [1, 2]
