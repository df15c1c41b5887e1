"""The choices registry (`dlmrt/ops/choices.py`): a choice is recorded once under its key and
logged once, the report lists it, and the environment pins decide through it. CPU."""

from __future__ import annotations

import logging

import pytest
import torch

from dlmrt import ops
from dlmrt.ops import choices, fp8_choice, fp8_glu_choice, nvfp4_choice

CUDA = torch.device("cuda")  # never touched: a pin decides before any measurement


@pytest.fixture(autouse=True)
def _clean():
    choices.forget("test ")
    yield
    choices.forget("test ")


def _lines(caplog, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(what)]


def test_a_choice_is_recorded_once_and_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        first = choices.record("test gemm 8x16->32", "bf16", "faster", {"bf16": 1.0, "fp8": 2.0})
        again = choices.record("test gemm 8x16->32", "bf16", "faster", {"bf16": 1.0, "fp8": 2.0})
    assert again is first and choices.get("test gemm 8x16->32") is first
    assert _lines(caplog, "test gemm") == ["test gemm 8x16->32: bf16 (faster)"]
    assert first.options == {"bf16": 1.0, "fp8": 2.0}


def test_a_changed_pick_replaces_the_record_and_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        choices.record("test glu", "separate", "measured")
        choices.record("test glu", "one kernel", "DLMRT_FP8_GLU=on")
    assert choices.get("test glu").pick == "one kernel"
    assert _lines(caplog, "test glu") == [
        "test glu: separate (measured)",
        "test glu: one kernel (DLMRT_FP8_GLU=on)",
    ]


def test_the_report_lists_the_choices_in_order():
    choices.record("test b", "x", "why b")
    choices.record("test a", "y")
    assert choices.report("test ") == "test b: x (why b)\ntest a: y"
    assert [c.what for c in choices.recorded("test ")] == ["test b", "test a"]
    choices.forget("test b")
    assert choices.report("test ") == "test a: y"


def test_pins_decide_through_the_registry(monkeypatch):
    monkeypatch.setattr(fp8_choice, "measure", lambda *a: pytest.fail("measured"))
    monkeypatch.setenv("DLMRT_FP8_GEMMS", "none")
    assert fp8_choice.use_fp8_gemm(256, 2560, 9728, CUDA) == (False, "DLMRT_FP8_GEMMS=none", None)
    got = choices.get(fp8_choice.gemm_key(256, 2560, 9728, True))
    assert (got.pick, got.why) == ("bf16", "DLMRT_FP8_GEMMS=none")
    monkeypatch.setenv("DLMRT_FP8_GLU", "off")
    assert fp8_glu_choice.use_glu(256, 9728, 2560, 2560, CUDA, False)[0] is False
    assert (
        "fp8 swiglu 256x2560->2x9728->2560: gate|up + activation: separate (DLMRT_FP8_GLU=off)"
        in (choices.report("fp8 swiglu"))
    )
    monkeypatch.setenv("DLMRT_NVFP4_DENSE", "kernel")
    assert nvfp4_choice.use_nvfp4_dense(64, [(64, 32)], CUDA) == (True, "DLMRT_NVFP4_DENSE=kernel")
    assert choices.get("nvfp4 dense mlp 64 rows, 32->64").pick == "W4A16 kernel"


def test_ops_resolve_through_the_registry(monkeypatch):
    monkeypatch.setenv("DLMRT_OPS", "torch")
    ops.use(None)
    try:
        assert ops.implementation("rms_norm") == "torch"
        assert choices.get("op rms_norm").why == "DLMRT_OPS=torch"
        ops.use("torch")
        assert choices.get("op silu_mul").pick == "torch"
    finally:
        ops.use(None)
    assert choices.recorded("op ") == []
