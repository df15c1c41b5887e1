"""The device benchmarks, run from the repository root as modules:
`python -m benchmarks.rounds.round_latency ...` (rounds/, kernels/, orl/; shared pieces here).

`python -m` puts the working directory, the repository root, first on sys.path. The root holds
`kernels/` (installed as `dlmrt._kernels`), which would shadow PyPI's `kernels` package that
transformers >= 5.25 imports (`rounds/peer_transformers.py` loads transformers' models). This
package is imported by then, and its modules resolve through it, so the root comes off again:
the rule `tests/conftest.py` applies to the test suite.
"""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]
