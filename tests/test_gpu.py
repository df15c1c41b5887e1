"""The same engine on a CUDA device (run on the device machine: pytest -m gpu)."""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint

from dlmrt import LLM, reference
from dlmrt.decoding import make_rule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
PROMPT = [(37 * i + 11) % 256 for i in range(13)]


@pytest.mark.parametrize(
    "rule,knob", [("threshold", {"threshold": 0.25}), ("entropy_budget", {"entropy_budget": 4.0})]
)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_cuda_fp32_engine_matches_oracle(tmp_path, rule, knob, temperature):
    """fp32 on CUDA: the cached engine and the no-cache oracle agree token for token."""
    llm = LLM(
        write_checkpoint(tmp_path / "m", residual=residual_config()), device="cuda", dtype="float32"
    )
    out = llm.generate(
        PROMPT,
        rule=rule,
        max_new_tokens=40,
        temperature=temperature,
        seed=3,
        ignore_eos=True,
        **knob,
    )
    tokens, reason = reference.generate(
        llm.model,
        PROMPT,
        rule=make_rule(rule, **knob),
        block_size=8,
        max_new_tokens=40,
        mask_id=llm.mask_id,
        stop_ids=llm.stop_ids,
        temperature=temperature,
        seed=3,
        ignore_eos=True,
    )
    assert out.token_ids == tokens and out.finish_reason == reason


def test_cuda_default_dtype_is_bf16_and_generates(tmp_path):
    """On a GPU the default dtype is bfloat16; generation runs to max_new_tokens."""
    llm = LLM(write_checkpoint(tmp_path / "m", residual=residual_config()))
    assert llm.device.type == "cuda" and llm.dtype == torch.bfloat16
    assert next(llm.model.parameters()).dtype == torch.bfloat16
    out = llm.generate("hello", max_new_tokens=33, ignore_eos=True)
    assert len(out.token_ids) == 33 and out.finish_reason == "length"
    assert out.num_denoising_forwards >= 5  # 33 tokens after a 5-token prompt tail: 5 blocks of 8
