"""LLaDA2 on CUDA (eager): the engine == `reference.generate`, both presets, Base and ORL."""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_llada2_checkpoint

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
    )
    assert llm.mode == "eager"
    prompt = [(37 * i + 11) % 256 for i in range(11)]
    out = llm.generate(prompt, editing=editing, max_new_tokens=21, ignore_eos=True)
    tokens, reason = reference.generate(
        llm.model,
        prompt,
        rule=make_rule("llada_editing", editing=editing),
        block_size=llm.model_config.block_size,
        max_new_tokens=21,
        mask_id=llm.mask_id,
        stop_ids=llm.stop_ids,
        ignore_eos=True,
    )
    assert out.token_ids == tokens and out.finish_reason == reason


def test_cuda_bf16_runs(tmp_path):
    llm = LLM(write_llada2_checkpoint(tmp_path / "m", seed=1), device="cuda")
    out = llm.generate([5, 6, 7, 8], max_new_tokens=16, ignore_eos=True)
    assert len(out.token_ids) == 16 and out.num_denoising_forwards >= 1
