"""FlashAttention-4 as the optional arena attention of a round (`dlmrt/ops/flash_attn4.py`).

On the CPU a stand-in for `flash_attn.cute.flash_attn_varlen_func` implements its documented
contract strictly ([batch, seqlen, heads, head_dim], unit last stride, int32 `seqused_k` of shape
[batch], returns (out, lse)), so the layouts and the visible length we hand it are checked
against the torch twin. The real library is checked on the GPU when it is installed.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from dlmrt import capture_guard
from dlmrt.ops import flash_attn4, reference


def fake_varlen(q, k, v, seqused_k=None, softmax_scale=None, causal=False, **unused):
    """FlashAttention-4's varlen contract, in torch (batch 1, no causal mask, keys < seqused_k)."""
    assert not unused and not causal and softmax_scale is not None
    assert q.dim() == k.dim() == v.dim() == 4 and q.shape[0] == k.shape[0] == 1
    assert all(t.stride(-1) == 1 for t in (q, k, v)) and k.dtype == q.dtype == v.dtype
    assert seqused_k.dtype == torch.int32 and seqused_k.shape == (1,)
    n = int(seqused_k[0])
    qh, kh, vh = (t[0].transpose(0, 1) for t in (q, k[:, :n], v[:, :n]))  # [heads, len, d]
    groups = qh.shape[0] // kh.shape[0]
    kh, vh = kh.repeat_interleave(groups, 0), vh.repeat_interleave(groups, 0)
    p = torch.softmax(qh @ kh.transpose(1, 2) * softmax_scale, dim=-1)
    out = (p @ vh).transpose(0, 1).unsqueeze(0).contiguous()  # [1, rows, heads, d]
    return out, torch.zeros(1, qh.shape[0], qh.shape[1])


@pytest.fixture(autouse=True)
def _fresh():
    flash_attn4.reset()
    yield
    flash_attn4.reset()


@pytest.mark.parametrize("rows,block,start,arena", [(8, 8, 0, 40), (8, 8, 16, 40), (4, 4, 36, 40)])
def test_block_rows_match_the_twin_through_the_contract(rows, block, start, arena):
    """Our layouts (the arena's transpose, no copy) and the visible prefix give the twin's result
    for rows of one block: first block, a middle one, the arena's last."""
    torch.manual_seed(rows + start)
    q = torch.randn(4, rows, 16)
    k, v = torch.randn(2, arena, 16), torch.randn(2, arena, 16)
    pos = torch.arange(start, start + rows)
    got = flash_attn4.arena_attention(q, k, v, pos, block, 0.25, fn=fake_varlen)
    want = reference.arena_attention(q, k, v, pos, block, 0.25)
    assert got.shape == want.shape == (4, rows, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.transpose(0, 1).is_contiguous()  # o_proj's reshape stays free, as with our kernel


def test_visible_keys_is_the_blocks_end():
    pos = torch.arange(32, 48)
    assert flash_attn4.visible_keys(pos, 16).tolist() == [48]
    assert flash_attn4.visible_keys(pos, 16).dtype == torch.int32


def test_absent_library_is_logged_once_and_never_chosen(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, flash_attn4.MODULE, None)  # import fails: not installed
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        assert flash_attn4.varlen_fn() is None and flash_attn4.varlen_fn() is None
    lines = [r.message for r in caplog.records if "flash-attn-4" in r.message]
    assert len(lines) == 1 and "not usable" in lines[0] and "dlmrt[fa4]" in lines[0]
    q = torch.randn(2, 4, 16)
    assert not flash_attn4.chosen(q, torch.randn(1, 8, 16), torch.randn(1, 8, 16), 4, 0.25)


def test_off_switch_and_bad_value(monkeypatch):
    fake = types.SimpleNamespace(flash_attn_varlen_func=fake_varlen)
    monkeypatch.setitem(sys.modules, flash_attn4.MODULE, fake)
    monkeypatch.setenv("DLMRT_FA4", "off")
    assert flash_attn4.varlen_fn() is None
    flash_attn4.reset()
    monkeypatch.setenv("DLMRT_FA4", "auto")
    assert flash_attn4.varlen_fn() is fake_varlen
    monkeypatch.setenv("DLMRT_FA4", "maybe")
    flash_attn4.reset()
    with pytest.raises(ValueError, match="DLMRT_FA4='maybe'"):
        flash_attn4.varlen_fn()


def test_fits_needs_cuda_half_precision_and_head_dim(monkeypatch):
    """CPU tensors never fit; on a (faked) SM90 device the dtype and head_dim rules decide."""
    assert not flash_attn4.fits(torch.randn(2, 4, 128), torch.randn(1, 8, 128))

    class Cuda:  # just enough of a CUDA tensor for `fits`
        def __init__(self, d, dtype):
            self.shape, self.dtype, self.is_cuda, self.device = (2, 4, d), dtype, True, "cuda"

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    assert flash_attn4.fits(Cuda(128, bf16), Cuda(128, bf16))
    assert not flash_attn4.fits(Cuda(512, bf16), Cuda(512, bf16))  # DiffusionGemma's full layers
    assert not flash_attn4.fits(Cuda(128, bf16), Cuda(128, fp8))  # an FP8 arena
    assert not flash_attn4.fits(Cuda(128, torch.float32), Cuda(128, torch.float32))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not flash_attn4.fits(Cuda(128, bf16), Cuda(128, bf16))  # Ampere: not this path


def test_choice_is_measured_once_per_shape_and_logged(monkeypatch, caplog):
    fake = types.SimpleNamespace(flash_attn_varlen_func=fake_varlen)
    monkeypatch.setitem(sys.modules, flash_attn4.MODULE, fake)
    monkeypatch.setattr(flash_attn4, "fits", lambda q, k: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    timings = {16: (50.0, 40.0), 32: (30.0, 45.0)}  # rows -> (ours, FlashAttention-4) µs
    calls = []

    def measure(q, k, v, block, scale, fn):
        calls.append(q.shape[1])
        return timings[q.shape[1]]

    monkeypatch.setattr(flash_attn4, "_measure", measure)
    k = v = torch.randn(2, 64, 16)
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        assert flash_attn4.chosen(torch.randn(4, 16, 16), k, v, 16, 0.25)  # faster: used
        assert not flash_attn4.chosen(torch.randn(4, 32, 16), k, v, 32, 0.25)  # slower: ours
        assert flash_attn4.chosen(torch.randn(4, 16, 16), k, v, 16, 0.25)
    assert calls == [16, 32]  # each shape timed once
    text = caplog.text
    assert "flash-attn-4 (Triton 50.0 us, flash-attn-4 40.0 us)" in text
    assert "Triton (Triton 30.0 us, flash-attn-4 45.0 us)" in text
    monkeypatch.setenv("DLMRT_FA4", "on")  # unmeasured where it fits
    assert flash_attn4.chosen(torch.randn(4, 8, 16), k, v, 8, 0.25) and calls == [16, 32]


def test_no_timing_inside_a_capture(monkeypatch):
    fake = types.SimpleNamespace(flash_attn_varlen_func=fake_varlen)
    monkeypatch.setitem(sys.modules, flash_attn4.MODULE, fake)
    monkeypatch.setattr(flash_attn4, "fits", lambda q, k: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(flash_attn4, "_measure", lambda *a: pytest.fail("timed during capture"))
    k = torch.randn(2, 64, 16)
    assert not flash_attn4.chosen(torch.randn(4, 16, 16), k, k, 16, 0.25)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads,kv_heads,rows,arena,start",
    [(32, 8, 32, 4096, 1024), (32, 8, 256, 4096, 3584), (16, 4, 32, 1280, 0)],
)
def test_flash_attn4_matches_the_twin_and_captures(heads, kv_heads, rows, arena, start):
    """The installed library on block rows (Qwen3-4B and LLaDA-like heads), eager and replayed
    from a CUDA graph after the visible length moved."""
    pytest.importorskip("flash_attn.cute")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("FlashAttention-4's SM90+ path")
    torch.manual_seed(0)
    dev, bf16 = "cuda", torch.bfloat16
    q = torch.randn(heads, rows, 128, device=dev, dtype=bf16)
    k = torch.randn(kv_heads, arena, 128, device=dev, dtype=bf16)
    v = torch.randn(kv_heads, arena, 128, device=dev, dtype=bf16)
    pos = torch.arange(start, start + rows, device=dev)
    got = flash_attn4.arena_attention(q, k, v, pos, rows, 128**-0.5)
    want = reference.arena_attention(q.float(), k.float(), v.float(), pos, rows, 128**-0.5)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn4.arena_attention(q, k, v, pos, rows, 128**-0.5)
    torch.cuda.current_stream().wait_stream(stream)
    with capture_guard.graph(graph):
        out = flash_attn4.arena_attention(q, k, v, pos, rows, 128**-0.5)
    pos.copy_(torch.arange(rows, 2 * rows, device=dev))  # the second block: fewer keys
    graph.replay()
    want = reference.arena_attention(q.float(), k.float(), v.float(), pos, rows, 128**-0.5)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_rounds_run_flash_attn4_in_every_mode(tmp_path, monkeypatch):
    """DLMRT_FA4=on: a QwenDLM model's rounds use FlashAttention-4 (its shapes are recorded) and
    block_graph / round_graph still equal eager token for token (the WHILE graph captures it)."""
    pytest.importorskip("flash_attn.cute")
    from conftest import assert_modes_agree, write_checkpoint

    from dlmrt import LLM

    monkeypatch.setenv("DLMRT_FA4", "on")
    path = write_checkpoint(
        tmp_path / "m",
        hidden_size=512,
        intermediate_size=1024,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
    )
    outs = {}
    for mode in ("eager", "round_graph", "block_graph"):
        llm = LLM(path, device="cuda", dtype="bfloat16", mode=mode)
        outs[mode] = llm.generate(
            [5, 9, 13, 17, 21], rule="threshold", threshold=0.3, max_new_tokens=40, ignore_eos=True
        )
    assert_modes_agree(outs, "fa4")
    assert any(used for used in flash_attn4._CHOICE.values())  # the rounds went through it
