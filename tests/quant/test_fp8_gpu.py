"""GPU: each FP8 kernel against its torch twin over awkward sizes, and the three modes
token-identical with FP8 weights and with the FP8 KV arena (all three families).

Run on the device machine: pytest -m gpu.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_modes_agree, residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM, ops
from dlmrt.formats.fp8 import FP8, quantize_per_channel, quantize_rows
from dlmrt.impls.experts import W8A8Experts
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops import reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ROWS = (1, 7, 32, 256, 512)
MODES = ("eager", "round_graph", "block_graph")


def _close_codes(a, b) -> None:
    """Codes of the same values rounded in two orders: equal but for rare 1-step ties."""
    da, db = a.dequantize(torch.float32), b.dequantize(torch.float32)
    step = b.scale * 32  # one e4m3 step at the top binade (256..448) in value units
    assert ((da - db).abs() <= step + 1e-6).all()
    assert (a.q.view(torch.uint8) == b.q.view(torch.uint8)).float().mean() > 0.98
    torch.testing.assert_close(a.scale, b.scale, rtol=1e-2, atol=1e-9)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n", [80, 2560, 9728])
def test_producers_match_their_twins(rows, n):
    g = torch.Generator(device="cuda").manual_seed(rows * n)
    x = torch.randn(rows, n, device="cuda", generator=g, dtype=torch.bfloat16)
    r = torch.randn(rows, n, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.rand(n, device="cuda", generator=g, dtype=torch.bfloat16) + 0.5
    ops.use("triton")
    try:
        a, total = fp8_ops.add_rms_norm_fp8(x, r, w, 1e-6)
        plain = fp8_ops.rms_norm_fp8(x, w, 1e-6)
        silu = fp8_ops.silu_mul_fp8(torch.cat([x, r], 1))
        rows_q = fp8_ops.quant_rows(x)
    finally:
        ops.use(None)
    ref, ref_total = reference.add_rms_norm(x, r, w, 1e-6)
    assert a.q.dtype == FP8 and a.scale.shape == (rows, 1)
    torch.testing.assert_close(total, ref_total)
    _close_codes(a, quantize_rows(ref))
    _close_codes(plain, quantize_rows(reference.rms_norm(x, w, 1e-6)))
    _close_codes(silu, quantize_rows(reference.silu_mul(torch.cat([x, r], 1))))
    _close_codes(rows_q, quantize_rows(x))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("n", "k"), [(48, 336), (1040, 2560), (2560, 9728)])
def test_fp8_linear_matches_its_twin(rows, n, k):
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = quantize_per_channel(torch.randn(n, k, device="cuda", generator=g) / k**0.5)
    act = quantize_rows(x)
    fast = fp8_ops.fp8_linear(act, w)
    ref = (act.dequantize(torch.float32) @ w.dequantize(torch.float32).t()).to(torch.bfloat16)
    assert fast.dtype == torch.bfloat16 and fast.shape == (rows, n)
    torch.testing.assert_close(fast.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("rows", (1, 7, 32, 256))
@pytest.mark.parametrize("fused", [False, True])
def test_fp8_expert_kernel_matches_its_twin(rows, fused):
    """Weight-only FP8 experts: the kernel's in-register conversion == dequantize, then bf16."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    e, h, i, k = 16, 256, 192, 4
    x = torch.randn(rows, h, device="cuda", generator=g, dtype=torch.bfloat16)
    gate, up = (
        quantize_per_channel(torch.randn(e, i, h, device="cuda", generator=g) / 16) for _ in "gu"
    )
    down = quantize_per_channel(torch.randn(e, h, i, device="cuda", generator=g) / 14)
    index = torch.randint(0, e, (rows, k), device="cuda", generator=g)
    weights = torch.rand(rows, k, device="cuda", generator=g)
    scales = (gate.scale, up.scale, down.scale)
    if fused:
        gate_up = torch.cat([gate.qweight, up.qweight], 1)
    else:
        gate_up = (gate.qweight, up.qweight)
    fast = ops.moe_mlp(x, weights, index, gate_up, down.qweight, "silu", scales=scales)
    deq = [w.dequantize(torch.bfloat16) for w in (gate, up, down)]
    ref = reference.moe_mlp(x, weights, index, (deq[0], deq[1]), deq[2], "silu")
    torch.testing.assert_close(fast.float(), ref.float(), rtol=2e-2, atol=2e-2)
    from dlmrt._kernels.moe_mlp import moe_mlp  # the other accumulator orientation (kernels.md)

    swapped = moe_mlp(x, weights, index, gate_up, down.qweight, "silu", scales=scales, swap=True)
    torch.testing.assert_close(swapped.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("rows", "ctx"), [(7, 40), (32, 1000), (256, 1300)])
def test_arena_attention_reads_an_fp8_arena(rows, ctx):
    g = torch.Generator(device="cuda").manual_seed(rows)
    heads, kv_heads, d, block = 8, 2, 128, 32
    arena = -(-(ctx + rows) // block) * block  # the engine's arenas are block-aligned
    k = torch.randn(kv_heads, arena, d, device="cuda", generator=g).to(FP8)
    v = torch.randn(kv_heads, arena, d, device="cuda", generator=g).to(FP8)
    q = torch.randn(heads, rows, d, device="cuda", generator=g, dtype=torch.bfloat16)
    pos = torch.arange(ctx, ctx + rows, device="cuda")
    fast = ops.arena_attention(q, k, v, pos, block, d**-0.5)
    ref = reference.arena_attention(q, k, v, pos, block, d**-0.5)
    torch.testing.assert_close(fast.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8gpu")
    wide = dict(vocab_size=512, hidden_size=256, intermediate_size=512, head_dim=64)
    return {
        "qwen-orl": write_checkpoint(root / "q", residual=residual_config(), **wide),
        "llada": write_llada2_checkpoint(root / "l", vocab_size=512),
    }


@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("quant", [None, "fp8"])
@pytest.mark.parametrize("name", ["qwen-orl", "llada"])
def test_modes_agree_with_fp8_weights_and_arena(checkpoints, monkeypatch, name, quant, kv):
    if quant is None and kv == "auto":
        pytest.skip("the bf16 case: tests/engine/test_block_gpu.py")
    monkeypatch.setenv("DLMRT_FP8_GEMMS", "all")  # tiny shapes would measure bf16 faster
    monkeypatch.setenv("DLMRT_FP8_GEMM_KERNEL", "triton")  # the split-K GEMM in every mode
    monkeypatch.setenv("DLMRT_FP8_EXPERTS", "w8a8")  # LLaDA's experts: the FP8 MMA kernel
    kw = dict(device="cuda", quantization=quant, kv_cache_dtype=kv)
    llms = {m: LLM(checkpoints[name], mode=m, **kw) for m in MODES}
    for plen, temp in ((3, 0.0), (13, 0.8)):
        outs = {
            m: llm.generate(
                [(37 * i + 11) % 256 for i in range(plen)],
                max_new_tokens=29,
                temperature=temp,
                seed=plen,
                ignore_eos=True,
            )
            for m, llm in llms.items()
        }
        assert_modes_agree(outs, name, plen)


@pytest.mark.parametrize("experts_path", ["w8a8", "w8a16"])
@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_diffusion_gemma_modes_agree_with_fp8_experts(
    tmp_path_factory, monkeypatch, kv, experts_path
):
    """FP8 routed experts, W8A8 or weight-only (+ FP8 context arena): block_graph ==
    round_graph == static eager."""
    from dg_helpers import F_, S, _prompt, mid_checkpoint

    monkeypatch.setenv("DLMRT_FP8_GEMMS", "all")
    monkeypatch.setenv("DLMRT_FP8_GEMM_KERNEL", "triton")
    monkeypatch.setenv("DLMRT_FP8_EXPERTS", experts_path)
    path = mid_checkpoint(tmp_path_factory, [S, S, F_])
    llms = {
        m: LLM(path, device="cuda", mode=m, quantization="fp8", kv_cache_dtype=kv) for m in MODES
    }
    layer = llms["eager"].model.model.layers[0]
    experts = layer.experts
    assert experts.gate_up_proj.dtype == FP8 and experts.impl.scales is not None
    assert layer.self_attn.qkv.plan is not None and layer.mlp.down_proj.plan is not None
    assert isinstance(experts.impl, W8A8Experts) == (experts_path == "w8a8")
    for seed, (plen, max_new) in enumerate([(5, 40), (40, 64)]):
        outs = {
            m: llm.generate(_prompt(plen, seed), max_new_tokens=max_new, seed=seed, rng="counter")
            for m, llm in llms.items()
        }
        assert_modes_agree(outs, kv, seed)


def test_demo_model_accuracy_and_tpf_hold_in_fp8(monkeypatch):
    """The shipped demo model, 300 held-out problems: FP8 weights (every candidate forced to FP8)
    within 1 point of bf16 accuracy and 5% of its tokens per forward (numbers printed)."""
    from dlmrt.demo import demo_model_path
    from dlmrt.tasks import arithmetic
    from dlmrt.train.evaluate import evaluate

    monkeypatch.setenv("DLMRT_FP8_GEMMS", "all")
    results = {}
    for quant in (None, "fp8"):
        llm = LLM(demo_model_path(), device="cuda", quantization=quant)
        results[quant or "bf16"] = evaluate(llm, arithmetic, 300)
    bf16, fp8 = results["bf16"], results["fp8"]
    print({k: (r["accuracy"], round(r["tokens_per_forward"], 3)) for k, r in results.items()})
    assert abs(fp8["accuracy"] - bf16["accuracy"]) <= 0.01
    assert abs(fp8["tokens_per_forward"] / bf16["tokens_per_forward"] - 1) <= 0.05
