"""DLMRT_PDL reaches the kernels' switch (kernels/pdl.py) through `dlmrt.ops`, which records it
among the choices (so a benchmark's result says whether PDL was on). CPU: Triton is made to look
usable; no kernel runs."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
from dlmrt import ops  # noqa: E402
from dlmrt.ops import choices  # noqa: E402


@pytest.fixture
def triton_ops(monkeypatch):
    import dlmrt._kernels.pdl as pdl

    monkeypatch.setattr(ops, "_triton_ok", lambda: (True, "test: as if on CUDA"))
    ops.use(None)
    yield pdl
    pdl.ENABLED = False
    ops.use(None)
    choices.forget("programmatic dependent launch")


@pytest.mark.parametrize("flag", ["1", "0"])
def test_the_environment_sets_the_switch(triton_ops, monkeypatch, flag):
    monkeypatch.setenv("DLMRT_PDL", flag)
    triton_ops.ENABLED = flag == "0"  # the opposite: the op's resolution must set it
    assert ops.implementation("rms_norm") == "triton"
    assert triton_ops.ENABLED == (flag == "1")
    assert triton_ops.launch() == {"PDL": flag == "1", "launch_pdl": flag == "1"}
    expected = f"programmatic dependent launch: {'on' if flag == '1' else 'off'} (DLMRT_PDL={flag})"
    assert choices.get("programmatic dependent launch").line() == expected


def test_a_bad_value_is_refused(triton_ops, monkeypatch):
    monkeypatch.setenv("DLMRT_PDL", "yes")
    with pytest.raises(ValueError, match="DLMRT_PDL='yes'"):
        ops.implementation("rms_norm")
