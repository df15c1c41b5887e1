"""The PDL kernels as compiled (CPU: Triton compiles to PTX for sm_90 without a GPU).

With PDL the PTX holds griddepcontrol.wait, then griddepcontrol.launch_dependents, before the
kernel's first global memory instruction (loads, stores, atomics, TMA copies); with PDL off it
holds neither. A few kernels of different shapes: elementwise, an early `return` (expert tiles),
split-K with atomics over TMA descriptors, a single-program loop. test_pdl_launches.py checks
statically that every launched kernel opens with the same `pdl.enter(PDL)`.
"""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")
from dlmrt._kernels import fp8_gemm, fp8_glu_gemm, moe_mlp, moe_plan, silu_mul  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

DESC = "tensordesc<fp8e4nv[128, 128]>"
# (kernel, signature of its runtime arguments, its constexprs other than PDL)
CASES = {
    "silu_mul": (
        silu_mul._silu_mul_kernel,
        {"gu_ptr": "*bf16", "out_ptr": "*bf16", "stride_gu": "i32", "n": "i32"},
        {"BLOCK": 1024, "GELU": False},
    ),
    "moe_down": (
        moe_mlp._down_kernel,
        {"h_ptr": "*bf16", "down_ptr": "*bf16", "down_scale_ptr": "*fp32", "w_ptr": "*fp32"}
        | {"y_ptr": "*fp32", "order_ptr": "*i64", "tile_end_ptr": "*i32", "counts_ptr": "*i32"}
        | {"starts_ptr": "*i32", "stride_de": "i32", "stride_dn": "i32"},
        {"H": 256, "INTER": 128, "E": 8, "E_PAD": 8, "IEEE": False, "BM": 16, "BN": 64, "BK": 64}
        | {"SCALED": False, "SWAP": False},
    ),
    "fp8_gemm_tma": (
        fp8_gemm._fp8_gemm_tma_kernel,
        {"a_desc": DESC, "sa_ptr": "*fp32", "w_desc": DESC, "sw_ptr": "*fp32", "out_ptr": "*bf16"}
        | {"part_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
        | {"k_slice": "i32", "split": "i32", "stride_om": "i32"},
        {"BM": 128, "BN": 128, "BK": 128, "AMAX": False},
    ),
    "bf16_glu": (  # the unscaled form: two accumulators over TMA tiles, no atomics
        fp8_glu_gemm._fp8_glu_gemm_kernel,
        {"a_desc": "tensordesc<bf16[128, 64]>", "sa_ptr": "*bf16"}
        | {"w_desc": "tensordesc<bf16[64, 64]>", "sw_ptr": "*bf16", "y_ptr": "*bf16"}
        | {"amax_ptr": "*bf16", "M": "i32", "N_I": "i32", "K": "i32", "stride_ym": "i32"},
        {"BM": 128, "BN": 64, "BK": 64, "GELU": False, "SCALED": False, "IEEE": False},
    ),
    "moe_plan": (
        moe_plan._plan_kernel,
        {"index_ptr": "*i64", "order_ptr": "*i64", "tile_end_ptr": "*i32", "counts_ptr": "*i32"}
        | {"starts_ptr": "*i32", "P": "i32"},
        {"P_PAD": 256, "E": 8, "E_PAD": 8, "CH": 64, "BM": 16},
    ),
}
# an instruction whose opcode names the global state space: ld / st / atom / red .global,
# cp.async(.bulk.tensor) ... .global
_GLOBAL = re.compile(r"^(@!?%p\d+\s+)?[a-z]+\.\S*\.global\b|^(@!?%p\d+\s+)?[a-z]+\.global\b")


def _ptx(case: str, pdl: bool) -> list[str]:
    kernel, signature, constexprs = CASES[case]
    constexprs = constexprs | {"PDL": pdl}
    src = triton.compiler.ASTSource(
        fn=kernel,
        signature=signature | dict.fromkeys(constexprs, "constexpr"),
        constexprs=constexprs,
    )
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl})
    return [line.strip() for line in compiled.asm["ptx"].splitlines()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_wait_and_trigger_precede_every_global_access(case):
    lines = _ptx(case, pdl=True)
    accesses = [i for i, line in enumerate(lines) if _GLOBAL.match(line)]
    waits = [i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait")]
    triggers = [i for i, line in enumerate(lines) if line.startswith("griddepcontrol.launch_")]
    assert accesses, f"{case}: no global memory instruction found (pattern out of date?)"
    assert len(waits) == 1 and len(triggers) == 1, (waits, triggers)
    assert waits[0] < triggers[0] < accesses[0], lines[accesses[0]]


@pytest.mark.parametrize("case", sorted(CASES))
def test_pdl_off_compiles_away(case):
    lines = _ptx(case, pdl=False)
    assert not [line for line in lines if "griddepcontrol" in line]
    assert any(_GLOBAL.match(line) for line in lines)
