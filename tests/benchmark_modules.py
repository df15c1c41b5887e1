"""The device benchmarks' modules in the tests: `benchmarks.<name>` imported as
`python -m benchmarks.<name>` imports it, with the repository root still off sys.path (conftest
keeps it off: its `kernels/` would shadow PyPI's `kernels`)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str) -> ModuleType:
    """The module `benchmarks.<name>` (e.g. "kernels.moe_layer"); the package itself is found by
    its path, its modules through it."""
    if "benchmarks" not in sys.modules:
        spec = importlib.util.spec_from_file_location("benchmarks", BENCH / "__init__.py")
        package = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"benchmarks.{name}")
