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
    pdl.ENABLED = pdl.GEMMS = False
    ops.use(None)
    choices.forget("programmatic dependent launch")


@pytest.mark.parametrize(
    "flag, others, gemms, pick",
    [
        ("1", True, True, "on"),
        ("0", False, False, "off"),
        ("nogemm", True, False, "on but the GEMMs"),
    ],
)
def test_the_environment_sets_the_switch(triton_ops, monkeypatch, flag, others, gemms, pick):
    monkeypatch.setenv("DLMRT_PDL", flag)
    triton_ops.ENABLED, triton_ops.GEMMS = not others, not gemms  # resolution must set both
    assert ops.implementation("rms_norm") == "triton"
    assert triton_ops.launch() == {"PDL": others, "launch_pdl": others}
    assert triton_ops.launch(gemm=True) == {"PDL": gemms, "launch_pdl": gemms}
    expected = f"programmatic dependent launch: {pick} (DLMRT_PDL={flag})"
    assert choices.get("programmatic dependent launch").line() == expected


def test_a_bad_value_is_refused(triton_ops, monkeypatch):
    monkeypatch.setenv("DLMRT_PDL", "yes")
    with pytest.raises(ValueError, match="DLMRT_PDL='yes'"):
        ops.implementation("rms_norm")
