"""LLaDA2 end to end: the KV-cached engine == `reference.block.generate` token for token (CPU, fp32),
both editing presets, Base and ORL (residual adapter on "block" and "masked" rows)."""

from __future__ import annotations

import pytest
from conftest import residual_config, slow_unless, write_llada2_checkpoint

from dlmrt import LLM, reference
from dlmrt.decoding import make_rule
from dlmrt.errors import CheckpointError

# A "block" adapter feeds every row's next input from its previous logits: with a strong random
# adapter that recurrence is chaotic, and fp32 rounding (cached vs recomputed attention, ~1e-6)
# grows until an argmax flips (measured: identical in fp64). output_scale 0.01 keeps it
# contractive; the adapter still changes the tokens (asserted below).
ADAPTERS = {
    "base": None,
    "block": residual_config("block", post_norm_scale=None, output_scale=0.01),
    "masked": residual_config("masked", post_norm_scale=None, output_scale=0.01),
}


@pytest.fixture(scope="module")
def llms(tmp_path_factory):
    root = tmp_path_factory.mktemp("llada-oracle")
    return {
        (name, seed): LLM(
            write_llada2_checkpoint(root / f"{name}-{seed}", residual=res, seed=seed), device="cpu"
        )
        for name, res in ADAPTERS.items()
        for seed in (0, 1)
    }


def _prompt(n: int) -> list[int]:
    return [(37 * i + 11) % 256 for i in range(n)]


def _check(llm: LLM, prompt: list[int], editing: str, **kw):
    records = []
    out = llm.generate(prompt, editing=editing, recorder=records.append, **kw)
    tokens, reason = reference.block.generate(
        llm.model,
        prompt,
        rule=make_rule("llada_editing", editing=editing),
        block_length=llm.model_config.block_size,
        max_new_tokens=kw["max_new_tokens"],
        mask_id=llm.mask_id,
        stop_ids=llm.stop_ids,
        ignore_eos=kw.get("ignore_eos", False),
    )
    assert out.token_ids == tokens
    assert out.finish_reason == reason
    return out, records


KEPT = {("base", "quality", 3), ("block", "speed", 8), ("masked", "quality", 13)}


@pytest.mark.parametrize(
    ("adapter", "editing", "prompt_len"),
    [
        slow_unless((a, e, n) in KEPT, a, e, n)
        for a in ADAPTERS
        for e in ("quality", "speed")
        for n in (3, 8, 13)
    ],
)
def test_engine_matches_oracle(llms, adapter, editing, prompt_len):
    for seed in (0, 1):
        _check(
            llms[adapter, seed], _prompt(prompt_len), editing, max_new_tokens=21, ignore_eos=True
        )


def test_edits_happen_and_committed_kv_reflects_final_tokens(llms):
    """Edits rewrite filled rows (so a stale commit would break the parity above), never the prompt."""
    for editing in ("quality", "speed"):
        out, records = _check(
            llms["block", 0], _prompt(13), editing, max_new_tokens=21, ignore_eos=True
        )
        edited = sum(int(r.edited.sum()) for r in records)
        assert edited > 0, editing
        first = [r for r in records if r.block_index == 1]
        assert all(not r.edited[:5].any() for r in first)  # 13 = 8 + 5 prompt-tail rows
        assert max(out.rounds_per_block) > llms["block", 0].model_config.block_size // 2


def test_speed_rounds_are_bounded_by_max_post_steps(llms):
    llm = llms["base", 0]
    out = llm.generate(
        _prompt(8), editing="speed", max_post_steps=2, max_new_tokens=16, ignore_eos=True
    )
    assert max(out.rounds_per_block) <= 8 + 2
    # A folded joint pass is a round of two blocks but one forward (engine/fold.py).
    assert out.num_denoising_forwards <= sum(out.rounds_per_block)


def test_adapter_changes_tokens(llms):
    for name in ("block", "masked"):
        a = llms[name, 0].generate(
            _prompt(8), editing="quality", max_new_tokens=16, ignore_eos=True
        )
        b = llms["base", 0].generate(
            _prompt(8), editing="quality", max_new_tokens=16, ignore_eos=True
        )
        assert a.token_ids != b.token_ids, name


def test_stop_at_eos_after_the_block_is_full(llms):
    llm = llms["base", 1]
    free = llm.generate(_prompt(5), editing="quality", max_new_tokens=24, ignore_eos=True)
    stop = free.token_ids[6]
    saved = llm.stop_ids
    llm.stop_ids = {stop}
    try:
        out, _ = _check(llm, _prompt(5), "quality", max_new_tokens=24)
    finally:
        llm.stop_ids = saved
    assert (
        out.finish_reason == "stop"
        and out.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    )


def test_llm_defaults_and_modes(llms, tmp_path):
    llm = llms["base", 0]
    assert llm.default_rule == "llada_editing" and llm.mode == "eager"
    default = llm.generate(_prompt(4), max_new_tokens=12, ignore_eos=True)
    quality = llm.generate(_prompt(4), editing="quality", max_new_tokens=12, ignore_eos=True)
    assert default.token_ids == quality.token_ids
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>"
    assert llm.generate("hi", chat=True, max_new_tokens=8).finish_reason in ("stop", "length")
    path = write_llada2_checkpoint(tmp_path / "base")
    with pytest.raises(CheckpointError, match="role='orl'"):
        LLM(path, device="cpu", role="orl")
    with pytest.raises(ValueError, match="mode"):
        LLM(path, device="cpu", mode="round_graph")
    orl = LLM(
        write_llada2_checkpoint(tmp_path / "orl", residual=ADAPTERS["block"]),
        device="cpu",
        role="orl",
    )
    assert orl.model.adapter is not None and orl.default_rule == "llada_editing"
