"""A limit that ends inside the last block (or canvas): the whole block is decoded, then cut.

The reference decoders (SDAR's, LLaDA2's `generate`, transformers' DiffusionGemma loop) decode the
last block whole; the rows past the limit change what the other rows see. So a request with
max_new_tokens = N must give exactly the first N tokens of the same request asked for up to the
block's end (ignore_eos: no early stop). Before this rule dlmrt left those rows masked and
undecoded, and the answers near the end differed.
"""

from __future__ import annotations

import pytest
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM, reference
from dlmrt.decoding import make_rule


def _prompt(n: int) -> list[int]:
    return [(37 * i + 11) % 256 for i in range(n)]


@pytest.fixture(scope="module")
def block_llms(tmp_path_factory):
    root = tmp_path_factory.mktemp("lastblock")
    return {
        "qwen-base": LLM(write_checkpoint(root / "q", seed=3), device="cpu"),
        "qwen-orl": LLM(
            write_checkpoint(root / "qo", residual=residual_config("masked"), seed=4),
            device="cpu",
        ),
        "llada2": LLM(write_llada2_checkpoint(root / "l", seed=5), device="cpu"),
    }


@pytest.mark.parametrize("name", ["qwen-base", "qwen-orl", "llada2"])
@pytest.mark.parametrize("fold", [True, False])
def test_a_mid_block_limit_is_the_whole_block_cut(block_llms, name, fold):
    llm = block_llms[name]
    llm.engine.fold_commits = fold
    try:
        block = llm.model_config.block_size
        plen = 5
        full_end = -(-(plen + 2 * block) // block) * block - plen  # the 2nd block's end
        full = llm.generate(_prompt(plen), max_new_tokens=full_end, ignore_eos=True)
        for limit in range(full_end - block + 1, full_end):
            out = llm.generate(_prompt(plen), max_new_tokens=limit, ignore_eos=True)
            assert out.token_ids == full.token_ids[:limit], limit
            assert out.finish_reason == "length"
    finally:
        llm.engine.fold_commits = True


@pytest.mark.parametrize("name", ["qwen-orl", "llada2"])
def test_the_oracle_decodes_the_whole_last_block_too(block_llms, name):
    llm = block_llms[name]
    rule = llm.default_rule
    for limit in (3, 9, 13):
        out = llm.generate(_prompt(6), max_new_tokens=limit, ignore_eos=True)
        tokens, _ = reference.block.generate(
            llm.model,
            _prompt(6),
            rule=make_rule(rule),
            block_length=llm.model_config.block_size,
            max_new_tokens=limit,
            mask_id=llm.mask_id,
            stop_ids=llm.stop_ids,
            ignore_eos=True,
        )
        assert out.token_ids == tokens


def test_canvases_are_decoded_whole_and_cut(tmp_path):
    import torch
    import transformers.models.diffusion_gemma as dg
    from dg_helpers import _config, _randomise, save_checkpoint

    torch.manual_seed(0)
    hf = dg.DiffusionGemmaForBlockDiffusion(_config()).eval()
    _randomise(hf, 1)
    llm = LLM(save_checkpoint(hf, tmp_path / "dg"), device="cpu", dtype="float32")
    length = llm.engine.canvas_length
    kw = dict(ignore_eos=True, seed=1, rng="counter", max_denoising_steps=4)
    prompt = [t % 90 for t in _prompt(4)]
    full = llm.generate(prompt, max_new_tokens=2 * length, **kw)
    for limit in (length + 1, 2 * length - 1):
        out = llm.generate(prompt, max_new_tokens=limit, **kw)
        assert out.token_ids == full.token_ids[:limit]
