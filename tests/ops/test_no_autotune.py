"""No Triton autotuning at request time (issue 23): tiles are fixed per shape class.

CPU: the tile choice is a function of the shape class only (a new prompt length compiles no new
variant beyond its class) and no kernel module wraps a kernel in an autotuner. On CUDA the hook
`Autotuner._bench` is counted over real requests of new prompt lengths after warm-up
(tests/engine/test_overhead_gpu.py; the arena kernel's data-dependent key loop does not run in
TRITON_INTERPRET's interpreter).
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

triton = pytest.importorskip("triton")
import dlmrt._kernels as kernels  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402


@pytest.mark.parametrize("head_dim,ieee", [(64, False), (128, False), (256, False), (128, True)])
def test_tile_is_a_function_of_the_shape_class(head_dim, ieee):
    from dlmrt._kernels.arena_attention import SMALL_ROWS, tile_config

    configs = {tile_config(rows, head_dim, ieee) for rows in range(1, 8193)}
    assert len(configs) <= 2  # rounds / prefill: prompt lengths never add variants
    for block_m, block_n, warps, stages in configs:
        assert block_m >= 16 and block_m & (block_m - 1) == 0  # tl.dot needs M >= 16
        assert block_n >= 16 and block_n & (block_n - 1) == 0
        assert warps in (2, 4, 8) and stages >= 1
    small = tile_config(SMALL_ROWS, head_dim, ieee)
    assert all(tile_config(r, head_dim, ieee) == small for r in range(1, SMALL_ROWS + 1))


def test_no_kernel_module_autotunes():
    tuned = []
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        tuned += [f"{info.name}.{n}" for n, v in vars(module).items() if isinstance(v, Autotuner)]
    assert not tuned, f"autotuned kernels (they benchmark inside requests): {tuned}"


def test_wide_key_tiles_only_where_shared_memory_holds_them():
    """128-key tiles need ~208 KB of shared memory per block (H100 / H200: 227 KB); an A100
    (164 KB) or an Ada GPU (99 KB) keeps 64-key tiles, head dims > 128 too."""
    from dlmrt._kernels.arena_attention import HOPPER_SMEM, tile_config

    assert tile_config(256, 128, False, HOPPER_SMEM)[1] == 128
    assert tile_config(32, 64, False, HOPPER_SMEM)[1] == 128
    assert tile_config(256, 128, False, 164 * 1024)[1] == 64
    assert tile_config(32, 128, False, 99 * 1024)[1] == 64
    assert tile_config(32, 192, False, HOPPER_SMEM)[1] == 64
