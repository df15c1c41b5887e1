"""`benchmarks/account/` and `dlmrt/account.py`: kernels map to their innermost label, floors
follow the shapes, labels cost nothing when no account is taken, and an account of a tiny round
on the CPU covers the round."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from benchmark_modules import benchmark
from torch import nn

from dlmrt import account, capture_guard
from dlmrt.model_shapes import qwen_dlm_4b
from dlmrt.models.residual import ResidualConfig

events = benchmark("account.events")
floors = benchmark("account.floors")
table = benchmark("account.table")
Kernel, Span = events.Kernel, events.Span


def test_a_kernel_belongs_to_the_innermost_label_open_at_its_launch():
    cpu = [Span(0, 0, 100), Span(1, 10, 50), Span(2, 20, 30), Span(3, 60, 90)]
    dev = [Span(0, 1000, 1100), Span(3, 1060, 1090)]
    kernels = [
        Kernel("a", 1000, 1005, host=25),  # inside 0 > 1 > 2
        Kernel("b", 1005, 1010, host=40),  # after 2 closed: 1
        Kernel("c", 1010, 1020, host=95),  # only 0
        Kernel("d", 1020, 1030, host=150),  # outside every label
        Kernel("e", 1030, 1040, host=70, seq=2),  # launched by a label itself: that label
        Kernel("f", 1070, 1080),  # no launching op: the shortest device span around it
        Kernel("g", 1200, 1210),  # neither
    ]
    assert events.assign(kernels, cpu, dev) == [2, 1, 0, None, 2, 3, None]


def _event(name, start, end, dev=False, eid=0, link=0, annotation=False, parent=None):
    return SimpleNamespace(
        name=name,
        device_type=SimpleNamespace(name="CUDA" if dev else "CPU"),
        time_range=SimpleNamespace(start=start, end=end),
        id=eid,
        linked_correlation_id=link,
        is_user_annotation=annotation,
        cpu_parent=parent,
    )


def test_device_kernels_link_through_the_op_that_launched_them():
    label = _event("dlmrt#0 layers.0.mlp", 0, 100, eid=1, annotation=True)
    mm = _event("aten::mm", 10, 20, eid=2, parent=label)
    events_ = [
        label,
        mm,
        _event("dlmrt#1 qk_norm_rope", 30, 40, eid=3, annotation=True, parent=label),
        _event("cudaLaunchKernel", 12, 13, eid=77, link=2),  # a runtime event: not a frontend op
        _event("dlmrt#0 layers.0.mlp", 500, 600, dev=True, annotation=True),  # device copy
        _event("sm90_gemm", 500, 550, dev=True, eid=77, link=2),
        _event("_qkv_norm_rope", 560, 570, dev=True, eid=78, link=3),  # a Triton launch
        _event("Memset (Device)", 580, 590, dev=True, eid=79, link=999),  # link lost
    ]
    kernels, cpu, dev = events.parse(events_)
    assert [k.name for k in kernels] == ["sm90_gemm", "_qkv_norm_rope", "Memset (Device)"]
    assert [(s.seq, s.start) for s in cpu] == [(0, 0), (1, 30)] and [s.seq for s in dev] == [0]
    assert events.assign(kernels, cpu, dev) == [0, 1, 0]
    cpu_only = [e for e in events_ if e.device_type.name == "CPU"]
    kernels, _, _ = events.parse(cpu_only)  # no device events: the ops called in a label stand in
    assert [k.name for k in kernels] == ["aten::mm"]


def _bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


def test_floors_count_bytes_and_flops_of_the_shapes_that_ran():
    cost = floors.Cost(flops=2e9, nbytes=3e6)
    assert cost.floor_us(3e12, 1e15) == pytest.approx(2.0)  # FLOP-bound
    assert floors.Cost(2e9, 3e6, fp8=True).floor_us(3e12, 1e15) == pytest.approx(1.0)
    assert floors.Cost(0, 3e6).floor_us(3e12, 1e15) == pytest.approx(1.0)  # byte-bound
    x, w = _bf16(256, 64), _bf16(96, 64)
    gemm = floors.cost(account.Record(0, "qkv", None, (x, w)))
    assert gemm.flops == 2 * 256 * 96 * 64
    assert gemm.nbytes == (256 * 64 + 96 * 64 + 256 * 96) * 2
    logits, embed = _bf16(8, 500), _bf16(500, 64)  # z = p E: the [K, N] layout
    assert floors.cost(account.Record(0, "orl_z", None, (logits, embed))).nbytes == 2 * (
        8 * 500 + 500 * 64 + 8 * 64
    )
    tied = floors.cost(account.Record(0, "vocab_pass", None, (_bf16(8, 64), embed, embed)))
    assert tied.nbytes == 2 * (8 * 64 + 500 * 64)  # a tied weight is read once
    assert tied.flops == 2 * 8 * 500 * 64 * 2
    h, head = _bf16(8, 64), _bf16(500, 64)  # DiffusionGemma's one pass: head and E, untied
    one = floors.cost(account.Record(0, "canvas_vocab_pass", None, (h, head, embed), (h,)))
    assert one.flops == 2 * 8 * 500 * 64 * 2 and one.nbytes == 2 * (8 * 64 + 2 * 500 * 64)
    glu = floors.cost(account.Record(0, "gate_up_act", None, (x, w)))  # act(gate) * up: N / 2
    assert glu.flops == gemm.flops and glu.nbytes == (256 * 64 + 96 * 64 + 256 * 48) * 2


def test_attention_floor_reads_the_visible_keys_only():
    q, k, v = _bf16(4, 16, 8), _bf16(2, 100, 8), _bf16(2, 100, 8)
    positions = torch.arange(40, 56)  # 56 keys visible
    cost = floors.cost(account.Record(0, "attention", None, (q, k, v, positions)))
    assert cost.flops == 4 * 4 * 16 * 56 * 8
    assert cost.nbytes == 2 * q.nbytes + 56 * 2 * (2 * 8 * 2)
    window = floors.cost(account.Record(0, "attention", None, (q, k, v, positions, 10)))
    assert window.flops == 4 * 4 * 16 * (9 + 16) * 8


def test_module_floors_weights_routing_and_nesting():
    lin = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    x, y = _bf16(16, 64), _bf16(16, 32)
    cost = floors.cost(account.Record(0, "o_proj", None, (x,), (y,), module=lin))
    assert cost.flops == 2 * 16 * 64 * 32 and cost.nbytes == (64 * 32 + 16 * 64 + 16 * 32) * 2
    from dlmrt.models.experts import Experts

    ex = Experts(8, 16, 4, "silu", fused_gate_up=False).to(torch.bfloat16)
    index = torch.tensor([[0, 1], [1, 2]])  # 3 of 8 experts touched
    xe, out = _bf16(2, 16), _bf16(2, 16)
    cost = floors.cost(account.Record(0, "experts", None, (xe, None, index), (out,), ex))
    assert cost.nbytes == 3 * 8 * 16 * 4 * 2 * 3 / 8 + 2 * 2 * 16 * 2
    assert cost.flops == 2 * 4 * 3 * 16 * 4
    container = account.Record(0, "self_attn", None, (x,), module=lin, children=2)
    assert floors.cost(container) is None  # glue around nested ops: no floor


def test_labels_are_no_ops_unless_an_account_is_taken(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.profiler, "record_function", lambda *a: calls.append(a))
    assert account.label("qkv", _bf16(2, 2)) is account.label("rule")  # the shared null context
    model = _tiny_qwen()
    from dlmrt.attention import AttnContext

    with torch.inference_mode():
        model(torch.arange(8), AttnContext(torch.arange(8), 4))
    assert calls == []
    monkeypatch.setattr(capture_guard, "_depth", 1)  # a capture is open
    with pytest.raises(RuntimeError, match="capture"):
        with account.taking():
            pass


def test_labels_under_capture_stay_off_while_an_account_is_taken(monkeypatch):
    with account.taking() as records:
        monkeypatch.setattr(capture_guard, "_depth", 1)
        with account.label("qkv"):
            pass
        monkeypatch.setattr(capture_guard, "_depth", 0)
        with account.label("rule"):
            pass
    assert [r.name for r in records] == ["rule"]


def _tiny_qwen(layers: int = 2):
    common = benchmark("common")
    cfg = replace(
        qwen_dlm_4b(layers),
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mask_token_id=500,
        block_size=16,
        residual=ResidualConfig(intermediate_size=96, input_scale=0.125, output_scale=0.125),
    )
    torch.manual_seed(0)
    return common.random_model(cfg, torch.device("cpu"))


def test_an_account_of_a_tiny_round_covers_the_round():
    acct = benchmark("rounds.account")
    model = _tiny_qwen(layers=3)
    round_fn = benchmark("rounds.profile_round").round_fn("qwen_dlm", model, None, 32)
    result = acct.take_account(model, round_fn, warmup=1, bandwidth=1e9, peak_flops=1e11)
    json.dumps(result)  # the result file's content
    kinds = {r["kind"]: r for r in result["kinds"]}
    per_layer = ["self_attn.qkv", "self_attn.qk_norm_rope", "self_attn.attention"]
    per_layer += ["self_attn.o_proj", "mlp.gate_up", "mlp.act_mul", "mlp.down_proj"]
    per_layer += ["input_layernorm", "post_attention_layernorm"]
    for name in per_layer:
        assert kinds[f"layers.*.{name}"]["ops"] == 3, name
    for name in ("embed_tokens", "rope_tables", "norm", "lm_head", "orl_z", "rule"):
        assert name in kinds
    assert {r["layer"] for r in result["kernels"]} == {None, 0, 1, 2}
    total = result["total"]
    assert total["kernels"] == len(result["kernels"]) == sum(r["kernels"] for r in kinds.values())
    assert total["unlabelled_us"] < 0.02 * total["kernel_us"]
    excess = [r["excess_us"] for r in result["kinds"]]
    assert excess == sorted(excess, reverse=True)
    gemm = kinds["layers.*.self_attn.qkv"]
    assert gemm["floor_us"] > 0  # CPU-sized floors (1 GB/s, 100 GFLOP/s): they round visibly
    assert gemm["ratio"] == pytest.approx(gemm["us"] / gemm["floor_us"], rel=0.01)
    text = table.markdown(result["kinds"], result["kernels"], total)
    assert "| **round** |" in text and "layers.2.mlp.down_proj" in text


def test_an_account_of_a_tiny_diffusion_gemma_step(tmp_path_factory):
    from dg_helpers import tiny_checkpoint

    from dlmrt import LLM

    model = LLM(tiny_checkpoint(tmp_path_factory)[0], device="cpu").model
    step = benchmark("rounds.profile_round").canvas_step_fn(model, 12)
    result = benchmark("rounds.account").take_account(model, step, warmup=1)
    kinds = {r["kind"] for r in result["kinds"]}
    per_layer = ["self_attn.q_norm_rope", "self_attn.kv_norm_rope", "self_attn.attention"]
    per_layer += ["router.route", "experts", "mlp.gate_up", "attn_residual", "layer_out"]
    assert {f"layers.*.{k}" for k in per_layer} <= kinds
    assert {"canvas_vocab", "lm_head", "rule"} <= kinds
    total = result["total"]
    assert total["unlabelled_us"] < 0.05 * total["kernel_us"]
