"""The device benchmarks' host-side pieces, checked on the CPU (the timings themselves need CUDA)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from benchmark_modules import benchmark


def _tiny_llada(layers: int = 2):
    """A tiny random LLaDA2 (16 experts in 4 groups, top-3) built as the benchmarks build theirs."""
    from dlmrt.model_shapes import llada21_mini
    from dlmrt.models.llada2 import LLaDA2

    cfg = replace(
        llada21_mini(layers),
        vocab_size=300,
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rotary_dim=8,
        num_experts=16,
        n_group=4,
        topk_group=2,
        top_k=3,
        moe_intermediate_size=8,
        block_size=4,
    )
    return benchmark("common").random_model(cfg, torch.device("cpu"), torch.float32, cls=LLaDA2)


def test_moe_floor_counts_the_touched_experts():
    moe = benchmark("kernels.moe_layer")
    shape = moe.Shape("t", hidden=64, experts=16, inter=32, top_k=2, rows=3, activation="silu")
    index = torch.tensor([[0, 1], [1, 2], [2, 0]])  # 3 distinct experts
    floor, touched = moe.floor_ms(shape, index)
    weight_bytes = (3 * 3 * 64 * 32 + 16 * 64) * 2
    flops = 2 * 6 * 3 * 64 * 32 + 2 * 3 * 64 * 16
    assert touched == 3
    assert floor == max(flops / moe.PEAK_FLOPS, weight_bytes / moe.PEAK_BYTES) * 1e3


def test_moe_layer_runs_on_the_twins():
    """Both routings and activations run end to end on the CPU twins at a tiny shape."""
    from dlmrt.ops import reference

    moe = benchmark("kernels.moe_layer")
    for n_group, act in ((4, "silu"), (0, "gelu_tanh")):
        shape = moe.Shape("t", 32, 16, 24, 4, 5, act, n_group=n_group)
        layer, route = moe.make_layer(shape, torch.device("cpu"), torch.float32)
        weights, index = route(reference)
        assert index.shape == (5, 4) and torch.isfinite(weights).all()
        out = layer(reference)
        assert out.shape == (5, 32) and torch.isfinite(out).all() and out.abs().sum() > 0


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_grouped_mm_experts_match_a_loop_over_the_pairs(activation: str):
    """The peer path of moe_layer.py / moe_fp8.py (pairs sorted by expert, grouped GEMMs,
    scatter-add) on the CPU's torch._grouped_mm against a loop over every (row, slot) pair;
    expert 3 gets no pair."""
    moe = benchmark("kernels.moe_layer")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, generator=gen).bfloat16()
    gate_up_t = (torch.randn(4, 16, 32, generator=gen) / 4).bfloat16()
    down_t = (torch.randn(4, 16, 16, generator=gen) / 4).bfloat16()
    index = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2], [1, 0]])
    weights = torch.rand(5, 2, generator=gen)
    order, offs, src = moe.sort_by_expert(index, 4)
    assert offs.tolist() == [4, 7, 10, 10] and index.flatten()[order].tolist() == sorted(
        index.flatten().tolist()
    )
    got = moe.grouped_mm_experts(x, weights, index, gate_up_t, down_t, activation)
    want = torch.zeros(5, 16)
    for r in range(5):
        for j in range(2):
            e = int(index[r, j])
            h = moe.glu(x[r].float() @ gate_up_t[e].float(), activation)
            want[r] += weights[r, j] * (h @ down_t[e].float())
    torch.testing.assert_close(got.float(), want, rtol=0.03, atol=0.03)


def test_moe_round_floor_counts_dense_weights_and_touched_experts():
    """A tiny LLaDA2: the hook counts one round's distinct experts per MoE layer, and the floor's
    bytes are every non-embedding weight but the routed experts, plus the touched experts, plus KV."""
    from dlmrt.attention import AttnContext

    mm = benchmark("moe_models")
    model = _tiny_llada(layers=3)  # one dense layer, two MoE layers
    assert all(b.abs().sum() == 0 for n, b in model.named_buffers() if "expert_bias" in n)
    touched = mm.TouchedExperts(model)
    ids = torch.arange(5)
    model(ids, AttnContext(ids, 4))
    touched.close()
    assert len(touched.per_layer) == 2 and all(3 <= t <= 15 for t in touched.per_layer)
    assert touched.pairs == 2 * 5 * 3
    flops, nbytes = mm.moe_round_floor(model, 5, 7, touched)
    per_expert = 3 * 32 * 8
    total = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    dense = total - 2 * 16 * per_expert
    kv = 3 * 2 * 12 * 16 * 4
    assert nbytes == (dense + sum(touched.per_layer) * per_expert) * 4 + kv
    assert flops == 2 * 5 * dense + 2 * 30 * per_expert + 3 * 4 * 5 * 12 * 32


def test_grouped_mm_experts_match_the_twin():
    """The benchmark's torch._grouped_mm expert path computes the same layer as `moe_mlp`'s twin
    (experts hit 0, 1 and several times), both activations, in bf16 (torch's CPU grouped GEMM)."""
    from dlmrt.ops import reference

    moe = benchmark("kernels.moe_layer")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 32, generator=gen).bfloat16()
    gate_up = (0.1 * torch.randn(6, 32, 32, generator=gen)).bfloat16()
    down = (0.1 * torch.randn(6, 32, 16, generator=gen)).bfloat16()
    index = torch.tensor([[0, 1], [1, 2], [2, 1], [1, 0], [5, 1], [0, 2], [1, 5]])  # 3, 4 unused
    weights = torch.rand(7, 2, generator=gen)
    for act in ("silu", "gelu_tanh"):
        got = moe.grouped_mm_experts(
            x, weights, index, gate_up.transpose(1, 2), down.transpose(1, 2), act
        )
        want = reference.moe_mlp(x, weights, index, gate_up, down, act)
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_peer_transformers_runs_both_engines_on_one_checkpoint(tmp_path):
    """The side-by-side benchmark's CPU smoke path: a tiny checkpoint through transformers'
    generate and dlmrt, the same forced step count, a result file with both."""
    import json

    peer = benchmark("rounds.peer_transformers")
    out = tmp_path / "peer.json"
    argv = ["--tiny", "--device", "cpu", "--layers", "2", "--steps", "2", "--new-tokens", "32"]
    results = peer.main(argv + ["--modes", "eager", "--out", str(out), "--git-revision", "test"])
    assert set(results) == {"transformers", "dlmrt_eager"}
    assert all(r["tokens_per_s"] > 0 and r["ms_per_step"] > 0 for r in results.values())
    assert json.loads(out.read_text())["results"] == results


def test_round_history_keeps_the_shipped_runs_in_time_order(tmp_path):
    """bf16 block_graph runs of the shipped configuration, ordered by when they were written;
    experiments named in the file, other weights, an FP8 arena and LLaDA's all-mask canvas
    left out."""
    import json

    history = benchmark("round_history_plot")

    def write(
        name, model, when, ms, weights="bf16", kv="auto", canvas="random", mode="block_graph"
    ):
        shape = {"canvas": canvas, "dtype": {"weights": weights, "kv_cache": kv}}
        row = {"context": 1024, "mode": mode, "ms_per_round": ms, "floor_ms": 1.0}
        data = {"model": model, "date": when, "git_revision": "abc1234def", "shape": shape}
        (tmp_path / f"round_latency_{name}.json").write_text(json.dumps(data | {"results": [row]}))

    write("qwen_dlm_b", "qwen_dlm", "2026-12-02T10:00:00+00:00", 5.5)
    write("qwen_dlm_a", "qwen_dlm", "2026-12-02T12:00:00+00:00", 5.4)  # later, sorts first by name
    write("qwen_dlm_fa4on", "qwen_dlm", "2026-12-02T13:00:00+00:00", 5.3)
    write("qwen_dlm_x", "qwen_dlm", "2026-12-02T13:00:00+00:00", 5.0, weights="fp8")
    write("qwen_dlm_y", "qwen_dlm", "2026-12-02T13:00:00+00:00", 5.0, kv="fp8")
    write("qwen_dlm_z", "qwen_dlm", "2026-12-02T13:00:00+00:00", 5.0, mode="eager")
    write("llada2_a", "llada2", "2026-12-02T13:00:00+00:00", 3.9)
    write("llada2_b", "llada2", "2026-12-02T13:00:00+00:00", 3.0, canvas="masks")
    runs = history.shipped_runs(str(tmp_path))
    assert [r["ms"] for r in runs[("qwen_dlm", 1024)]] == [5.5, 5.4]
    assert runs[("qwen_dlm", 1024)][0]["revision"] == "abc1234"
    assert [r["ms"] for r in runs[("llada2", 1024)]] == [3.9]
    assert runs[("diffusion_gemma", 1024)] == []


@pytest.mark.parametrize("family", ["llada2", "diffusion_gemma"])
def test_route_to_first_keeps_every_row_on_the_first_experts(tmp_path_factory, family):
    """--route-to N: the biased routers pick only among each layer's first N experts (the
    touched count the floor reads follows); N outside [top_k, experts] is refused."""
    from dlmrt.attention import AttnContext

    mm = benchmark("moe_models")
    if family == "llada2":
        model, n, rows = _tiny_llada(), 5, 24
        run = lambda: model(torch.arange(rows), AttnContext(torch.arange(rows), 4))  # noqa: E731
    else:
        from dg_helpers import tiny_checkpoint

        from dlmrt import LLM

        model = LLM(tiny_checkpoint(tmp_path_factory)[0], device="cpu").model
        n, rows = 3, 16
        ids = torch.randint(0, 96, (rows,), generator=torch.Generator().manual_seed(0))
        run = lambda: model(ids, AttnContext(torch.arange(rows), rows), canvas=rows)  # noqa: E731
    before = mm.TouchedExperts(model)
    run()
    before.close()
    assert max(before.per_layer) > n  # random weights spread further
    assert mm.route_to_first(model, n) == n
    after = mm.TouchedExperts(model)
    index = []
    hook = [
        m.register_forward_hook(lambda _m, _a, out: index.append(out[1]))
        for m in model.modules()
        if mm._router(m)
    ]
    run()
    after.close()
    for h in hook:
        h.remove()
    assert all(t <= n for t in after.per_layer) and max(after.per_layer) == n
    assert all(int(i.max()) < n for i in index)
    with pytest.raises(ValueError, match="--route-to"):
        mm.route_to_first(model, 1)  # fewer than top_k


def test_prefix_chat_reuses_earlier_turns_with_the_same_answers():
    """The chat benchmark on the demo model (CPU): the second turn reuses part of its prompt, and
    every answer equals the one without reuse."""
    result = benchmark("rounds.prefix_chat").main(["--device", "cpu", "--turns", "2"])
    assert result["reuse"][0]["cached_tokens"] == 0
    assert 0 < result["reuse"][1]["cached_tokens"] < result["reuse"][1]["prompt_tokens"]
    assert all(t["cached_tokens"] == 0 for t in result["cold"])
    assert result["same_answers"] == [True, True]
