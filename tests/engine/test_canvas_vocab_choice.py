"""Which kernel runs DiffusionGemma's vocabulary pass (DLMRT_CANVAS_VOCAB,
`engine/encoder_decoder/vocab_choice.py`): decided once per canvas program and recorded; the
split kernel gives a tiny DiffusionGemma the one-program kernel's tokens (both kernels run under
TRITON_INTERPRET=1 on the CPU tensors of the eager step)."""

from __future__ import annotations

import pytest
import torch
from dg_helpers import STOPS, _prompt, ckpt  # noqa: F401
from kernel_env import kernel_test

from dlmrt import ops
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.engine import EncoderDecoderEngine
from dlmrt.engine.encoder_decoder import vocab_choice
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.ops import choices

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _clean():
    choices.forget("canvas vocabulary")
    yield
    choices.forget("canvas vocabulary")


def test_rows_by_default_a_pin_and_a_bad_value(monkeypatch):
    monkeypatch.delenv("DLMRT_CANVAS_VOCAB", raising=False)
    assert vocab_choice.canvas_vocab_kernel() == "rows"
    assert choices.get("canvas vocabulary").why.startswith("DLMRT_CANVAS_VOCAB=rows")
    monkeypatch.setenv("DLMRT_CANVAS_VOCAB", "Split")
    assert vocab_choice.canvas_vocab_kernel() == "split"
    assert choices.get("canvas vocabulary").pick == "split"
    monkeypatch.setenv("DLMRT_CANVAS_VOCAB", "maybe")
    with pytest.raises(ValueError, match="DLMRT_CANVAS_VOCAB='maybe'"):
        vocab_choice.canvas_vocab_kernel()


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


@kernel_test
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_block_graph_tokens_with_either_kernel(ckpt, tmp_path_factory, monkeypatch):  # noqa: F811
    """block_graph, fp32, the tiny and the mid-size model: the same tokens and finish with
    DLMRT_CANVAS_VOCAB=rows and =split, each decided when the program is built. The split
    kernel's blocks are cut to 64 entries so vocabularies of 96 and 1,024 make 2 and 16 splits
    (at 2,048 they would be one; the 262,144-way shape is the kernel tests')."""
    from dg_helpers import F_, S, mid_checkpoint
    from dlmrt._kernels import canvas_vocab_split

    from dlmrt import LLM

    monkeypatch.setattr(canvas_vocab_split, "BLOCK", 64)

    paths = (ckpt[0], mid_checkpoint(tmp_path_factory, [S, F_]))
    for path in paths:
        outs = {}
        for pin in ("rows", "split"):
            monkeypatch.setenv("DLMRT_CANVAS_VOCAB", pin)
            llm = LLM(path, device="cuda", dtype="float32", mode="block_graph")
            outs[pin] = [
                llm.generate(_prompt(9, seed), max_new_tokens=40, seed=seed, rng="counter")
                for seed in range(3)
            ]
            assert choices.get("canvas vocabulary").pick == pin
        for a, b in zip(outs["rows"], outs["split"], strict=True):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
