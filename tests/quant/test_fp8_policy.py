"""The FP8 policy table over each family's real parameter names, and the ignore-list matching."""

from __future__ import annotations

import pytest

from dlmrt.loading.policy import classify, matches


@pytest.mark.parametrize(
    "name, reason",
    [
        ("model.layers.0.self_attn.q_proj.weight", "attention projection"),
        ("model.layers.3.self_attn.o_proj.weight", "attention projection"),
        ("model.layers.0.attention.query_key_value.weight", "attention projection"),
        ("model.layers.0.attention.dense.weight", "attention projection"),
        ("model.layers.0.mlp.gate_proj.weight", "dense MLP"),
        ("model.layers.1.mlp.shared_experts.down_proj.weight", "dense MLP"),
        ("model.layers.1.mlp.experts.gate_proj", "routed experts"),  # LLaDA2 stacked
        ("model.layers.1.mlp.experts.7.up_proj.weight", "routed experts"),  # LLaDA2 stored
        ("model.decoder.layers.0.experts.gate_up_proj", "routed experts"),  # DiffusionGemma
        ("model.layers.0.experts.down_proj", "routed experts"),
        ("lm_head.weight", "lm_head"),
    ],
)
def test_fp8_candidates(name, reason):
    assert classify(name) == (True, reason)


@pytest.mark.parametrize(
    "name, reason",
    [
        ("model.residual_adapter.gate_proj.weight", "ORL residual adapter (bf16, as in the paper)"),
        ("model.residual_adapter.down_proj.weight", "ORL residual adapter (bf16, as in the paper)"),
        ("model.self_conditioning.up_proj.weight", "self-conditioning MLP (bf16, as in the paper)"),
        ("model.embed_tokens.weight", "embedding"),
        ("model.word_embeddings.weight", "embedding"),
        ("model.layers.0.input_layernorm.weight", "norm"),
        ("model.layers.0.self_attn.q_norm.weight", "norm"),
        ("model.layers.1.mlp.gate.weight", "router"),  # LLaDA2: `gate` is the router, not gate_proj
        ("model.layers.0.router.proj.weight", "router"),
        ("model.layers.0.router.per_expert_scale", "not a linear projection"),
        ("model.layers.1.mlp.gate.expert_bias", "not a linear projection"),
    ],
)
def test_never_fp8(name, reason):
    assert classify(name) == (False, reason)


def test_ignore_patterns_plain_regex_and_glob():
    q = "model.layers.0.self_attn.q_proj.weight"
    assert matches(["lm_head"], "lm_head.weight") == "lm_head"
    assert matches(["model.layers.0.self_attn.q_proj"], q) is not None
    assert matches(["model.layers.0.self_attn"], q) is None  # a parent module is not the module
    assert matches(["re:.*self_attn\\.q_proj$"], q) == "re:.*self_attn\\.q_proj$"
    assert matches(["re:.*k_proj"], q) is None
    assert matches(["*layers.0.*"], q) == "*layers.0.*"
    assert matches(["*layers.1.*"], q) is None
    # a stacked expert tensor is named by the parameter or by its `experts` module
    experts = "model.decoder.layers.2.experts.gate_up_proj"
    assert matches(["model.decoder.layers.2.experts"], experts) is not None
    assert matches(["*experts.gate_up_proj"], experts) is not None
    assert matches(["*experts.down_proj"], experts) is None
