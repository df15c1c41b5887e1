"""DiffusionGemma canvas decoding on CUDA: token parity with transformers' generate (torch RNG)."""

from __future__ import annotations

import pytest
import torch
from dg_helpers import SETTINGS, STOPS, _expected, _prompt, ckpt  # noqa: F401

from dlmrt import LLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture
def twins():
    """Parity with transformers runs dlmrt's torch twins (the reference roundings): the Triton MoE
    kernel accumulates in another order (it is tested against the twins in test_moe_gpu.py)."""
    from dlmrt import ops

    ops.use("torch")
    yield
    ops.use(None)


@pytest.mark.parametrize("settings", [0, 2])
def test_cuda_generate_matches_transformers(ckpt, settings, twins):  # noqa: F811
    """fp32 on the GPU: transformers' global CUDA generator and ours, seeded alike, draw alike."""
    path, hf = ckpt
    hf = hf.to("cuda")
    llm = LLM(path, device="cuda", dtype="float32")
    kw = SETTINGS[settings]
    for seed in range(3):
        prompt = _prompt(9, seed)
        torch.manual_seed(seed)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=20, **kw)
        out = llm.generate(prompt, max_new_tokens=20, seed=seed, **kw)
        assert out.token_ids == _expected(ref.sequences[0, 9:].tolist(), 20)
        assert out.finish_reason == ("stop" if out.token_ids[-1] in STOPS else "length")


@pytest.mark.parametrize("settings", [0, 2])
def test_cuda_bf16_generate_matches_transformers(ckpt, settings):  # noqa: F811
    """bf16 on the GPU against transformers' eager experts loop (its reference roundings), with
    dlmrt's ops forced to the torch twins (the Triton MoE kernel accumulates in another order)."""
    import transformers.models.diffusion_gemma as dg

    from dlmrt import ops

    path = ckpt[0]
    hf = dg.DiffusionGemmaForBlockDiffusion.from_pretrained(
        path, dtype=torch.bfloat16, experts_implementation="eager"
    )
    hf = hf.to("cuda").eval()
    ops.use("torch")
    try:
        llm = LLM(path, device="cuda", dtype="bfloat16")
        for seed in range(3):
            prompt = _prompt(11, seed)
            torch.manual_seed(seed)
            with torch.no_grad():
                ref = hf.generate(
                    torch.tensor([prompt], device="cuda"), max_new_tokens=20, **SETTINGS[settings]
                )
            out = llm.generate(prompt, max_new_tokens=20, seed=seed, **SETTINGS[settings])
            assert out.token_ids == _expected(ref.sequences[0, 11:].tolist(), 20)
    finally:
        ops.use(None)


def test_cuda_bf16_and_counter_rng_run(ckpt):  # noqa: F811
    """bf16 (the default dtype on CUDA) and the counter RNG: block_graph by default, the same
    tokens as the eager static path, reproducible per seed, different across seeds."""
    llm = LLM(ckpt[0], device="cuda")
    eager = LLM(ckpt[0], device="cuda", mode="eager")
    assert llm.dtype == torch.bfloat16 and llm.mode == "block_graph"
    kw = dict(max_new_tokens=16, rng="counter", ignore_eos=True, **SETTINGS[0])
    a, b = (x.generate(_prompt(6, 1), seed=2, **kw) for x in (llm, eager))
    assert a.mode == "block_graph" and b.mode == "eager" and a.token_ids == b.token_ids
    assert len(a.token_ids) == 16 and all(0 <= t < 96 for t in a.token_ids)
    others = {tuple(llm.generate(_prompt(6, 1), seed=s, **kw).token_ids) for s in range(3, 6)}
    assert len(others | {tuple(a.token_ids)}) > 1  # the seed reaches the noise
