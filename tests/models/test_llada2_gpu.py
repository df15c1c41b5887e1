"""LLaDA2 on CUDA: eager engine == `reference.block.generate`; block_graph == round_graph == eager."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_modes_agree, residual_config, write_llada2_checkpoint

from dlmrt import LLM, reference
from dlmrt.decoding import make_rule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("adapter", [None, "block"])
@pytest.mark.parametrize("editing", ["quality", "speed"])
def test_cuda_engine_matches_oracle(tmp_path, adapter, editing):
    res = (
        None
        if adapter is None
        else residual_config(adapter, post_norm_scale=None, output_scale=0.01)
    )
    llm = LLM(
        write_llada2_checkpoint(tmp_path / "m", residual=res, seed=0),
        device="cuda",
        dtype="float32",
        mode="eager",
    )
    prompt = [(37 * i + 11) % 256 for i in range(11)]
    out = llm.generate(prompt, editing=editing, max_new_tokens=21, ignore_eos=True)
    tokens, reason = reference.block.generate(
        llm.model,
        prompt,
        rule=make_rule("llada_editing", editing=editing),
        block_length=llm.model_config.block_size,
        max_new_tokens=21,
        mask_id=llm.mask_id,
        stop_ids=llm.stop_ids,
        ignore_eos=True,
    )
    assert out.token_ids == tokens and out.finish_reason == reason


def test_cuda_bf16_runs(tmp_path):
    """The CUDA defaults (bf16, block_graph with the Triton MoE kernels) give the eager bf16
    engine's tokens and a whole, folded request."""
    path = write_llada2_checkpoint(tmp_path / "m", seed=1)
    llm, eager = LLM(path, device="cuda"), LLM(path, device="cuda", mode="eager")
    assert llm.dtype == torch.bfloat16 and llm.mode == "block_graph"
    out, ref = (x.generate([5, 6, 7, 8], max_new_tokens=16, ignore_eos=True) for x in (llm, eager))
    assert out.mode == "block_graph" and out.token_ids == ref.token_ids
    assert len(out.token_ids) == 16 and out.num_commit_forwards == 0
    assert out.num_denoising_forwards == ref.num_denoising_forwards >= len(out.rounds_per_block)


MODES = ("eager", "round_graph", "block_graph")
# a mid-size MoE: 64 experts in 8 groups, top-6, 48-row blocks (rows hit 0, 1 and many experts)
MID = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    rotary_dim=16,
    num_experts=64,
    n_group=8,
    topk_group=4,
    num_experts_per_tok=6,
    moe_intermediate_size=128,
    block_size=48,
)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("size", ["tiny", "mid"])
@pytest.mark.parametrize("adapter", [None, "block"])
def test_all_modes_give_the_same_tokens(tmp_path, dtype, size, adapter):
    """The editing rule and the MoE kernels inside CUDA graphs: same tokens and rounds as eager,
    both presets, greedy and sampled, prompts ending mid-block and on a block boundary."""
    res = None if adapter is None else residual_config(adapter, post_norm_scale=None)
    path = write_llada2_checkpoint(
        tmp_path / "m", residual=res, seed=3, **(MID if size == "mid" else {})
    )
    llms = {m: LLM(path, device="cuda", dtype=dtype, mode=m) for m in MODES}
    assert {m: llm.mode for m, llm in llms.items()} == {m: m for m in MODES}
    block = llms["eager"].model_config.block_size
    for editing in ("quality", "speed"):
        for plen, temp in ((5, 0.0), (block, 0.0), (block + 7, 0.7)):
            prompt = [(37 * i + 11) % 256 for i in range(plen)]
            outs = {
                m: llm.generate(
                    prompt,
                    editing=editing,
                    max_new_tokens=2 * block + 5,
                    temperature=temp,
                    seed=plen,
                    ignore_eos=True,
                )
                for m, llm in llms.items()
            }
            assert_modes_agree(outs, editing, plen)


def test_auto_mode_picks_block_graph_for_llada2(tmp_path):
    llm = LLM(write_llada2_checkpoint(tmp_path / "m", seed=2), device="cuda")
    assert llm.mode == "block_graph"
    out = llm.generate([5, 6, 7], max_new_tokens=40, ignore_eos=True)
    assert out.mode == "block_graph" and len(out.token_ids) == 40


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_router_logits_one_half_gemm_match_the_fp32_path(dtype):
    """The router's CUDA path (one tensor-core GEMM, fp32 accumulation and output) gives the
    fp32 path's logits up to summation order, and the same routing (LLaDA-2.1-mini's shapes)."""
    from dlmrt.models.moe import router_logits

    torch.manual_seed(0)
    x = torch.randn(32, 2048, device="cuda", dtype=dtype)
    w = torch.randn(256, 2048, device="cuda", dtype=dtype) / 2048**0.5
    fast = router_logits(x, w, lambda: w.float())
    slow = torch.nn.functional.linear(x.float(), w.float())
    assert fast.dtype == torch.float32 and fast.shape == (32, 256)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    assert torch.equal(fast.topk(8).indices.sort().values, slow.topk(8).indices.sort().values)
    x3 = x.reshape(4, 8, 2048)  # any leading shape, as F.linear
    assert router_logits(x3, w, lambda: w.float()).shape == (4, 8, 256)
