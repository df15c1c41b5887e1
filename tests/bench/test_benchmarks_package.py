"""benchmarks/ is a package run as `python -m benchmarks.<folder>.<module>` from the repository
root: no script edits sys.path, and the root's `kernels/` does not shadow PyPI's `kernels`."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from benchmark_modules import BENCH, benchmark


def test_no_benchmark_script_edits_sys_path():
    """Only the package's `__init__.py` touches sys.path (it takes the root off); no script puts
    a folder on it, so none needs a `noqa: E402` wall of imports."""
    scripts = [p for p in BENCH.rglob("*.py") if p.name != "__init__.py"]
    assert len(scripts) > 20
    for path in scripts:
        src = path.read_text()
        assert "sys.path" not in src and "noqa: E402" not in src, path


def test_a_run_from_the_root_imports_pypis_kernels():
    """`python -m` puts the root first on sys.path; importing the package takes it off again, so
    transformers' `import kernels` finds PyPI's package, not the repository's Triton kernels."""
    if importlib.util.find_spec("kernels") is None:
        pytest.skip("PyPI's kernels is not installed")
    code = "import benchmarks, kernels; print(kernels.__file__)"
    root = BENCH.parent
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert not Path(out.stdout.strip()).resolve().is_relative_to(root / "kernels")


def test_a_result_records_the_module_command(monkeypatch):
    common = benchmark("common")
    main = SimpleNamespace(__spec__=SimpleNamespace(name="benchmarks.kernels.moe_fp8"))
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/kernels/moe_fp8.py", "--iters", "5"])
    assert common.command_line() == "python -m benchmarks.kernels.moe_fp8 --iters 5"
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__spec__=None))
    assert common.command_line() == "/x/benchmarks/kernels/moe_fp8.py --iters 5"


def test_the_floors_follow_the_device():
    """The byte floors use the measured copy bandwidth of the GPU the benchmark runs on."""
    device_copy_bandwidth = benchmark("common").device_copy_bandwidth
    assert device_copy_bandwidth("NVIDIA H100 80GB HBM3") == 3.0e12
    assert device_copy_bandwidth("NVIDIA H200") == 4.3e12
    assert device_copy_bandwidth("Some other GPU") == 4.3e12  # the table's default
