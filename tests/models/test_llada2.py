"""LLaDA2 (`llada2_moe`): router on hand-computed cases, MoE and the whole model against naive
per-token loops written here from the model description in `dlmrt/models/llada2.py`, checkpoint loading and its errors (CPU, fp32)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import llada2_config, llada2_weights, write_llada2_checkpoint
from safetensors.torch import load_file, save_file

from dlmrt import ops
from dlmrt.attention import AttnContext
from dlmrt.errors import CheckpointError
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.models.llada2_config import DEFAULT_BLOCK_LENGTH, llada2_config_from_hf

CPU = torch.device("cpu")


def _logit(p: list[float]) -> torch.Tensor:
    """Router logits whose sigmoid is exactly-ish p (one row)."""
    p = torch.tensor([p], dtype=torch.float64)
    return torch.log(p / (1 - p)).float()


# 8 experts in 4 groups of 2. Group scores (top-2 sums): 1.0, 1.15, 0.85, 0.4.
SCORES = [0.9, 0.1, 0.6, 0.55, 0.8, 0.05, 0.2, 0.2]


def _route(bias=None, top_k=2, norm=True, scaling=2.5, topk_group=2):
    b = None if bias is None else torch.tensor(bias)
    return ops.moe_route_grouped(_logit(SCORES), b, 4, topk_group, top_k, norm, scaling)


def test_router_group_limit_excludes_a_strong_expert_in_a_weak_group():
    weights, index = _route()
    # Kept groups {1, 0}; expert 4 (0.8) sits in group 2 and is excluded.
    assert index.tolist() == [[0, 2]]
    torch.testing.assert_close(weights, torch.tensor([[0.9 / 1.5 * 2.5, 0.6 / 1.5 * 2.5]]))
    _, index = _route(topk_group=4)  # no group limit: the global top-2
    assert index.tolist() == [[0, 4]]


def test_router_expert_bias_moves_selection_but_not_weights():
    bias = [0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]
    weights, index = _route(bias)
    assert index.tolist() == [[3, 0]]  # biased 1.05 beats 0.9
    w = torch.tensor([[0.55, 0.9]]) / 1.45 * 2.5  # unbiased scores
    torch.testing.assert_close(weights, w)
    # A bias on a whole group changes which groups are kept: groups 1 and 2 win.
    weights, index = _route([-1.0, -1.0, 0, 0, 0, 0, 0, 0])
    assert index.tolist() == [[4, 2]]
    torch.testing.assert_close(weights, torch.tensor([[0.8, 0.6]]) / 1.4 * 2.5)


def test_router_scaling_and_normalisation():
    weights, _ = _route(scaling=1.0)
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0))
    weights, index = _route(norm=False, scaling=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.8, 1.2]]))
    weights, index = _route(top_k=1)  # a single expert keeps its raw score (HF reference)
    assert index.tolist() == [[0]]
    torch.testing.assert_close(weights, torch.tensor([[0.9 * 2.5]]))


def _rms(x, g, eps=1e-6):
    return g * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _swiglu(w, prefix, x):
    gate, up = x @ w[prefix + "gate_proj.weight"].T, x @ w[prefix + "up_proj.weight"].T
    return (F.silu(gate) * up) @ w[prefix + "down_proj.weight"].T


def _naive_moe(w, cfg, p, x):
    """Per token, per expert: sigmoid scores, group top-2 sums, group then expert top-k."""
    out = torch.zeros_like(x)
    e, groups = cfg["num_experts"], cfg["n_group"]
    for t in range(x.shape[0]):
        s = torch.sigmoid(x[t] @ w[p + "mlp.gate.weight"].T)
        b = s + w[p + "mlp.gate.expert_bias"]
        per = e // groups
        gscore = [sorted(b[g * per : (g + 1) * per].tolist())[-2:] for g in range(groups)]
        kept = sorted(range(groups), key=lambda g: -sum(gscore[g]))[: cfg["topk_group"]]
        cands = [i for i in range(e) if i // per in kept]
        chosen = sorted(cands, key=lambda i: -b[i].item())[: cfg["num_experts_per_tok"]]
        total = sum(s[i].item() for i in chosen)
        for i in chosen:
            wt = s[i] / total * cfg["routed_scaling_factor"]
            out[t] += wt * _swiglu(w, f"{p}mlp.experts.{i}.", x[t])
        out[t] += _swiglu(w, p + "mlp.shared_experts.", x[t])
    return out


def _naive_forward(w, cfg, ids, block):
    """The whole model, no cache, dense block-causal mask, straight from the description in `dlmrt/models/llada2.py`."""
    n, heads, kv, d = (
        len(ids),
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    )
    rot = cfg["rotary_dim"]
    pos = torch.arange(n)
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, rot, 2).float() / rot)
    cos, sin = (pos[:, None] * inv).cos()[:, None], (pos[:, None] * inv).sin()[:, None]

    def rope(x):  # [n, heads, d]: rotate-half within the first `rot` dims
        a, b = x[..., : rot // 2], x[..., rot // 2 : rot]
        return torch.cat((a * cos - b * sin, b * cos + a * sin, x[..., rot:]), -1)

    visible = (pos[None] // block) <= (pos[:, None] // block)
    h = w["model.word_embeddings.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = _rms(h, w[p + "input_layernorm.weight"])
        qkv = (x @ w[p + "attention.query_key_value.weight"].T).view(n, heads + 2 * kv, d)
        q = rope(_rms(qkv[:, :heads], w[p + "attention.query_layernorm.weight"]))
        k = rope(_rms(qkv[:, heads : heads + kv], w[p + "attention.key_layernorm.weight"]))
        v = qkv[:, heads + kv :]
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        att = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        att = att.masked_fill(~visible, float("-inf")).softmax(-1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(n, -1)
        h = h + o @ w[p + "attention.dense.weight"].T
        x = _rms(h, w[p + "post_attention_layernorm.weight"])
        dense = layer < cfg["first_k_dense_replace"]
        h = h + (_swiglu(w, p + "mlp.", x) if dense else _naive_moe(w, cfg, p, x))
    return _rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_llada2_checkpoint(tmp_path_factory.mktemp("llada2") / "ckpt")
    cfg = json.loads((path / "config.json").read_text())
    return path, cfg, load_file(str(path / "model.safetensors"))


def test_moe_layer_matches_naive_per_token_loop(tiny):
    path, cfg, w = tiny
    model = load_checkpoint(path, torch.float32, CPU).model
    x = torch.randn(11, cfg["hidden_size"], generator=torch.Generator().manual_seed(3))
    got = model.model.layers[1].mlp(x)
    torch.testing.assert_close(got, _naive_moe(w, cfg, "model.layers.1.", x), rtol=1e-5, atol=1e-5)
    dense = model.model.layers[0].mlp(x)  # layer 0: plain SwiGLU
    torch.testing.assert_close(dense, _swiglu(w, "model.layers.0.mlp.", x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [1, 4, 8])
def test_model_logits_match_naive_reference(tiny, block):
    path, cfg, w = tiny
    model = load_checkpoint(path, torch.float32, CPU).model
    ids = torch.tensor([(37 * i + 11) % 256 for i in range(13)])
    got = model(ids, AttnContext(torch.arange(13), block))
    torch.testing.assert_close(got, _naive_forward(w, cfg, ids, block), rtol=1e-4, atol=1e-4)


def test_config_values_come_from_config_json(tmp_path):
    cfg = llada2_config()
    del cfg["block_size"]
    parsed = llada2_config_from_hf(cfg, tmp_path / "config.json")
    assert parsed.block_size == DEFAULT_BLOCK_LENGTH == 32
    assert (parsed.rotary_dim, parsed.top_k, parsed.n_group, parsed.topk_group) == (8, 3, 4, 2)
    del cfg["rotary_dim"]
    cfg["partial_rotary_factor"] = 0.25
    assert llada2_config_from_hf(cfg, tmp_path / "config.json").rotary_dim == 4


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"n_group": 3}, "n_group"),
        ({"topk_group": 5}, "topk_group"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"num_experts": None}, "num_experts"),
        ({"partial_rotary_factor": 0.25}, "rotary_dim"),
        ({"use_bias": True}, "use_bias"),
        ({"score_function": "softmax"}, "score_function"),
    ],
)
def test_bad_config_fails_naming_the_field(tmp_path, override, field):
    good = llada2_weights(llada2_config(), seed=0)  # the weights fit; the config does not
    path = write_llada2_checkpoint(tmp_path / "bad", weights=good, **override)
    with pytest.raises(CheckpointError, match=field) as err:
        load_checkpoint(path, torch.float32, CPU)
    assert "config.json" in str(err.value)


def test_missing_expert_fails_naming_the_tensor(tmp_path):
    w = llada2_weights(llada2_config(), seed=0)
    del w["model.layers.2.mlp.experts.5.up_proj.weight"]
    path = write_llada2_checkpoint(tmp_path / "bad", weights=w)
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight"
    ):
        load_checkpoint(path, torch.float32, CPU)


def test_extra_or_misshapen_expert_fails(tmp_path):
    w = llada2_weights(llada2_config(), seed=0)
    w["model.layers.1.mlp.experts.8.gate_proj.weight"] = torch.zeros(24, 64)  # expert 8 of 8
    with pytest.raises(CheckpointError, match=r"unexpected tensor.*experts\.8\.gate_proj"):
        load_checkpoint(write_llada2_checkpoint(tmp_path / "extra", weights=w), torch.float32, CPU)
    w = llada2_weights(llada2_config(), seed=0)
    w["model.layers.1.mlp.experts.0.down_proj.weight"] = torch.zeros(64, 23)
    with pytest.raises(CheckpointError, match=r"experts\.0\.down_proj\.weight' has shape"):
        load_checkpoint(write_llada2_checkpoint(tmp_path / "shape", weights=w), torch.float32, CPU)


def test_experts_load_into_their_stacked_slices(tiny):
    path, _, w = tiny
    model = load_checkpoint(path, torch.float32, CPU).model
    experts = model.model.layers[2].mlp.experts
    for e in (0, 7):
        torch.testing.assert_close(
            experts.down_proj[e], w[f"model.layers.2.mlp.experts.{e}.down_proj.weight"]
        )
    bias = model.model.layers[1].mlp.gate.expert_bias
    torch.testing.assert_close(bias, w["model.layers.1.mlp.gate.expert_bias"])


def test_sharded_checkpoint_with_index_loads(tmp_path, tiny):
    _, cfg, w = tiny
    path = write_llada2_checkpoint(tmp_path / "sharded", weights=dict(w))
    (path / "model.safetensors").unlink()
    names = sorted(w)
    half = len(names) // 2
    shards = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
    for f, keys in shards.items():
        save_file({k: w[k].contiguous() for k in keys}, str(path / f))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    model = load_checkpoint(path, torch.float32, CPU).model
    ids = torch.arange(5)
    torch.testing.assert_close(
        model(ids, AttnContext(torch.arange(5), 8)),
        _naive_forward(w, cfg, ids, 8),
        rtol=1e-4,
        atol=1e-4,
    )


def test_router_fp32_weight_is_kept_and_follows_in_place_edits(tiny):
    """A bf16 router keeps one fp32 copy for inference, refreshed when its weight changes."""
    model = load_checkpoint(tiny[0], torch.float32, CPU).model
    router = model.model.layers[1].mlp.gate
    router.weight.data = router.weight.data.to(torch.bfloat16)
    with torch.no_grad():
        first = router.weight_fp32()
        assert first.dtype == torch.float32 and router.weight_fp32() is first  # kept
        assert torch.equal(first, router.weight.float())
        router.weight.mul_(2)  # an in-place edit (a trainer's step, a reload)
        second = router.weight_fp32()
        assert second is not first and torch.equal(second, router.weight.float())
    router.weight.requires_grad_(True)
    with torch.enable_grad():  # training: a fresh conversion autograd can see
        assert router.weight_fp32().grad_fn is not None


def test_router_logits_on_the_cpu_are_the_fp32_path():
    """Off CUDA (and in training) the router upcasts and runs an fp32 GEMM, bit for bit."""
    from dlmrt.models.moe import router_logits

    x = torch.randn(5, 64, dtype=torch.bfloat16)
    w = torch.randn(16, 64, dtype=torch.bfloat16)
    got = router_logits(x, w, lambda: w.float())
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.nn.functional.linear(x.float(), w.float()))


def test_a_config_as_shipped_without_eos_mask_and_qk_norm_keys(tmp_path):
    """LLaDA-2.1-mini's config.json omits eos_token_id, mask_token_id and use_qk_norm and carries
    rotary_dim, router_dtype and use_rmsnorm: it loads, QK-norm on. This vocabulary is too small
    for the released mask id (156895, tests/models/test_real_configs.py), so the tokenizer's mask
    token is the mask; the stop id is the config's pad id."""
    from conftest import EOS_ID, MASK_ID

    from dlmrt import LLM

    path = write_llada2_checkpoint(tmp_path / "m", router_dtype="fp32", use_rmsnorm=True)
    cfg = json.loads((path / "config.json").read_text())
    for key in ("eos_token_id", "mask_token_id", "use_qk_norm"):
        del cfg[key]
    (path / "config.json").write_text(json.dumps(cfg))
    llm = LLM(str(path), device="cpu", dtype="float32")
    assert llm.mask_id == MASK_ID and llm.stop_ids == {EOS_ID}
    stored = load_file(str(path / "model.safetensors"))  # QK-norm on: its weights are loaded
    name = "model.layers.0.attention.query_layernorm.weight"
    assert torch.equal(llm.model.state_dict()[name], stored[name].float())
    assert len(llm.generate([5, 6, 7], max_new_tokens=4, ignore_eos=True).token_ids) == 4
    cfg["use_rmsnorm"] = False
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'use_rmsnorm' = False: only RMSNorm"):
        LLM(str(path), device="cpu")
