"""Which kernel runs DiffusionGemma's vocabulary pass (DLMRT_CANVAS_VOCAB,
`engine/encoder_decoder/vocab_choice.py`): decided once per canvas program and recorded; the
split kernel and the one pass give a tiny DiffusionGemma the one-program kernel's tokens (the
kernels run under TRITON_INTERPRET=1 on the CPU tensors of the eager step)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from dg_helpers import STOPS, _prompt, ckpt  # noqa: F401
from kernel_env import INTERPRET
from torch import nn

from dlmrt import ops
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.engine import EncoderDecoderEngine
from dlmrt.engine.encoder_decoder import vocab_choice
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.ops import choices

CPU = torch.device("cpu")
# the kernels interpreted on the CPU tensors of an eager step; on a GPU machine (no interpreter)
# test_gpu_block_graph_tokens_with_either_kernel runs them compiled
interpreted = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (CPU tensors)")


@pytest.fixture(autouse=True)
def _clean():
    choices.forget("canvas vocabulary")
    yield
    choices.forget("canvas vocabulary")


def _model(head: nn.Module | None = None, dtype=torch.float32) -> SimpleNamespace:
    head = nn.Linear(8, 16, bias=False) if head is None else head
    return SimpleNamespace(lm_head=head, embed_table=torch.zeros(16, 8, dtype=dtype))


def test_split_by_default_a_pin_and_a_bad_value(monkeypatch):
    monkeypatch.delenv("DLMRT_CANVAS_VOCAB", raising=False)
    assert vocab_choice.canvas_vocab_kernel(_model()) == "split"
    assert choices.get("canvas vocabulary").why.startswith("DLMRT_CANVAS_VOCAB=split")
    monkeypatch.setenv("DLMRT_CANVAS_VOCAB", "Rows")
    assert vocab_choice.canvas_vocab_kernel(_model()) == "rows"
    assert choices.get("canvas vocabulary").pick == "rows"
    monkeypatch.setenv("DLMRT_CANVAS_VOCAB", "maybe")
    with pytest.raises(ValueError, match="DLMRT_CANVAS_VOCAB='maybe'"):
        vocab_choice.canvas_vocab_kernel(_model())


def test_onepass_pin_needs_a_plain_head_of_the_embedding_dtype(monkeypatch):
    monkeypatch.setenv("DLMRT_CANVAS_VOCAB", "OnePass")
    assert vocab_choice.canvas_vocab_kernel(_model()) == "onepass"
    assert choices.get("canvas vocabulary").why.startswith("DLMRT_CANVAS_VOCAB=onepass: op ")
    misfits = [
        (_model(nn.Sequential(nn.Linear(8, 16))), "the LM head is Sequential"),
        (_model(nn.Linear(8, 16, bias=True)), "the LM head is Linear"),
        (_model(dtype=torch.bfloat16), "not the embedding's dtype"),
    ]
    for model, why in misfits:
        assert vocab_choice.canvas_vocab_kernel(model) == "split"
        assert why in choices.get("canvas vocabulary").why


def _kernels_on_cpu(monkeypatch) -> list[str]:
    """Route `ops.canvas_vocab` to the Triton kernel its `kernel` names (interpreted on the CPU
    tensors; `ops` itself runs the twin there); returns the kernels called, in order."""
    import importlib

    called: list[str] = []

    def run(raw, softcap, temperature, u, sc, kernel="rows"):
        called.append(kernel)
        module = importlib.import_module(f"dlmrt._kernels.{ops.CANVAS_VOCAB_KERNELS[kernel]}")
        return module.canvas_vocab(raw, softcap, temperature, u, sc)

    monkeypatch.setattr(ops, "canvas_vocab", run)
    return called


@interpreted
def test_split_kernel_gives_the_same_tokens(ckpt, monkeypatch):  # noqa: F811
    """Eager engines pinned to each kernel: the same tokens, steps and finish (one canvas of
    three steps: the interpreter runs each program of each step's kernels in Python)."""
    model = load_checkpoint(ckpt[0], torch.float32, CPU).model
    called = _kernels_on_cpu(monkeypatch)
    settings = ebc.CanvasSettings(max_denoising_steps=3, confidence_threshold=50.0)
    results = {}
    for pin in ("rows", "split"):
        monkeypatch.setenv("DLMRT_CANVAS_VOCAB", pin)
        engine = EncoderDecoderEngine(model, CPU, "eager")
        assert engine.program(settings, 64).spec.vocab_kernel == pin
        start = len(called)
        results[pin] = [
            engine.generate(
                _prompt(5, seed), settings, max_new_tokens=8, stop_ids=list(STOPS), seed=seed
            )  # fmt: skip
            for seed in (0,)
        ]
        assert set(called[start:]) == {pin} and len(called) > start
    for a, b in zip(results["rows"], results["split"], strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.denoising_forwards == b.denoising_forwards
    monkeypatch.undo()  # the twin (ops.canvas_vocab on the CPU): the same tokens too
    engine = EncoderDecoderEngine(model, CPU, "eager")
    twin = engine.generate(_prompt(5, 0), settings, max_new_tokens=8, stop_ids=list(STOPS))
    assert twin.token_ids == results["split"][0].token_ids


def _generate(model, monkeypatch, pin: str, settings, trace: bool = False):
    """One request (seed 0) through an eager engine pinned to `pin`, with its step records."""
    monkeypatch.setenv("DLMRT_CANVAS_VOCAB", pin)
    engine = EncoderDecoderEngine(model, CPU, "eager")
    assert engine.program(settings, 64).spec.vocab_kernel == pin
    records = []
    out = engine.generate(
        _prompt(5, 0), settings, max_new_tokens=8, stop_ids=list(STOPS), seed=0,
        recorder=records.append if trace else None,
    )  # fmt: skip
    return out, records


def test_onepass_twin_gives_the_same_tokens_and_history(ckpt, monkeypatch):  # noqa: F811
    """On the CPU the one pass runs its twin (the head, `canvas_vocab`, the GEMM, op for op):
    the step keeps p @ E instead of p and the model scales it as `embed_probs` did, so tokens,
    steps and the step history (argmax, confidence, accepted) are bit for bit the same."""
    model = load_checkpoint(ckpt[0], torch.float32, CPU).model
    settings = ebc.CanvasSettings(max_denoising_steps=4, confidence_threshold=50.0)
    rows, rows_trace = _generate(model, monkeypatch, "rows", settings, trace=True)
    one, one_trace = _generate(model, monkeypatch, "onepass", settings, trace=True)
    assert one.token_ids == rows.token_ids and one.finish_reason == rows.finish_reason
    assert one.denoising_forwards == rows.denoising_forwards
    assert len(one_trace) == len(rows_trace) > 0
    for a, b in zip(one_trace, rows_trace, strict=True):
        assert torch.equal(a.argmax, b.argmax) and torch.equal(a.accepted, b.accepted)
        assert torch.equal(a.confidence, b.confidence)


@interpreted
def test_onepass_kernel_gives_the_same_tokens(ckpt, monkeypatch):  # noqa: F811
    """The one-pass kernel (interpreted on the CPU tensors of the eager step) against the
    one-program kernel: the same tokens, steps and finish (fp32: the self-conditioning embedding
    differs from the GEMM's by the order of additions, far from moving a token here)."""
    from dlmrt._kernels import canvas_vocab_pass

    model = load_checkpoint(ckpt[0], torch.float32, CPU).model
    called = _kernels_on_cpu(monkeypatch)
    passes: list[int] = []

    def one_pass(*args):
        passes.append(1)
        return canvas_vocab_pass.canvas_vocab_pass(*args)

    monkeypatch.setattr(ops, "canvas_vocab_pass", one_pass)
    settings = ebc.CanvasSettings(max_denoising_steps=3, confidence_threshold=50.0)
    rows, _ = _generate(model, monkeypatch, "rows", settings)
    assert called and not passes
    before = len(called)
    one, _ = _generate(model, monkeypatch, "onepass", settings)
    assert passes and len(called) == before  # the one pass replaces canvas_vocab
    assert one.token_ids == rows.token_ids and one.finish_reason == rows.finish_reason
    assert one.denoising_forwards == rows.denoising_forwards


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_block_graph_tokens_with_either_kernel(ckpt, tmp_path_factory, monkeypatch):  # noqa: F811
    """block_graph, fp32, the tiny and the mid-size model: the same tokens and finish with
    DLMRT_CANVAS_VOCAB=rows, =split and =onepass, each decided when the program is built. The
    split kernel's blocks are cut to 64 entries so vocabularies of 96 and 1,024 make 2 and 16
    splits (at 2,048 they would be one; the 262,144-way shape is the kernel tests')."""
    from dg_helpers import F_, S, mid_checkpoint
    from dlmrt._kernels import canvas_vocab_split

    from dlmrt import LLM

    monkeypatch.setattr(canvas_vocab_split, "BLOCK", 64)

    paths = (ckpt[0], mid_checkpoint(tmp_path_factory, [S, F_]))
    for path in paths:
        outs = {}
        for pin in ("rows", "split", "onepass"):
            monkeypatch.setenv("DLMRT_CANVAS_VOCAB", pin)
            llm = LLM(path, device="cuda", dtype="float32", mode="block_graph")
            outs[pin] = [
                llm.generate(_prompt(9, seed), max_new_tokens=40, seed=seed, rng="counter")
                for seed in range(3)
            ]
            assert choices.get("canvas vocabulary").pick == pin
        for pin in ("split", "onepass"):
            for a, b in zip(outs["rows"], outs[pin], strict=True):
                assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
