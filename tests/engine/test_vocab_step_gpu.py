"""GPU: rounds with the vocabulary in one pass (kernels/vocab_pass.py, DLMRT_VOCAB_PASS=on) give
the same tokens in every mode, and in fp32 the logits path's tokens.

Run on the device machine: pytest -m gpu.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_modes_agree, residual_config, write_checkpoint

from dlmrt import LLM
from dlmrt.ops import choices

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODES = ("eager", "round_graph", "block_graph")
PROMPT = [(37 * i + 11) % 256 for i in range(13)]
KW = {"rule": "threshold", "threshold": 0.25, "max_new_tokens": 40, "ignore_eos": True}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab-gpu")
    return {
        "orl": write_checkpoint(root / "orl", residual=residual_config()),
        "orl-t05": write_checkpoint(root / "t05", residual=residual_config(temperature=0.5)),
        "base": write_checkpoint(root / "base"),
    }


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["orl", "orl-t05", "base"])
def test_one_pass_modes_agree(checkpoints, monkeypatch, name, dtype):
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "on")
    llms = {m: LLM(checkpoints[name], device="cuda", dtype=dtype, mode=m) for m in MODES}
    outs = {m: llm.generate(PROMPT, **KW) for m, llm in llms.items()}
    assert choices.get("round vocabulary (greedy)").pick == "one pass"
    assert "op triton" in choices.get("round vocabulary (greedy)").why
    assert_modes_agree(outs, name, dtype)


@pytest.mark.parametrize("name", ["orl", "orl-t05", "base"])
def test_one_pass_gives_the_logits_tokens_in_fp32(checkpoints, monkeypatch, name):
    """fp32: the kernel's logits differ from cuBLAS's by summation order only (~1e-6), far below
    the test models' top-logit gaps, so the greedy tokens are the logits path's."""
    llm = LLM(checkpoints[name], device="cuda", dtype="float32", mode="block_graph")
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "on")
    one = llm.generate(PROMPT, **KW)
    monkeypatch.setenv("DLMRT_VOCAB_PASS", "off")
    assert llm.generate(PROMPT, **KW).token_ids == one.token_ids
