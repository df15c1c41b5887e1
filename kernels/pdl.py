"""Programmatic dependent launch (PDL) for every Triton kernel we launch: two switches.

With `ENABLED` (set once by `dlmrt.ops` from DLMRT_PDL), each kernel is launched with
`launch_pdl=True` (Triton 3.6: the launch carries the programmatic stream serialization attribute,
kept when a graph is captured) and its first statement is `pdl.enter(PDL)`: it waits for the
previous kernel of the stream, then lets the next one launch. So a kernel's launch and prologue
overlap the previous kernel's tail. `GEMMS` (DLMRT_PDL=1, not =nogemm) says whether the GEMM
main loops, launched with `launch(gemm=True)`, take part too. Hopper or newer. With PDL off both calls compile away
(constexpr), and the interpreter (TRITON_INTERPRET=1) drops the `launch_pdl` keyword.
`tests/ops/test_pdl_launches.py` checks every launched kernel and every launch site.
"""

import triton
import triton.language as tl

ENABLED = False
# The GEMM kernels (`launch(gemm=True)`: dense, GLU, NVFP4 and expert GEMMs) take part only when
# this is set too (DLMRT_PDL=1). DLMRT_PDL=nogemm leaves them out: a GEMM's last wave then keeps
# its SMs to itself instead of sharing them with the next grid's waiting programs.
GEMMS = False


def launch(gemm: bool = False) -> dict[str, bool]:
    """Keyword arguments of a kernel launch: the kernel's PDL constexpr and Triton's launch flag
    (`gemm`: the kernel is a GEMM main loop, governed by `GEMMS` as well)."""
    on = ENABLED and (GEMMS or not gemm)
    return {"PDL": on, "launch_pdl": on}


@triton.jit
def enter(PDL: tl.constexpr):
    """A PDL kernel's first statement, before any global load, store or atomic.

    gdc_wait (PTX griddepcontrol.wait) returns once the previous grid of the stream has completed
    and its memory operations are visible: no read-after-write or write-after-read overlap with it.
    Since every kernel waits before it completes, completion is transitive: a buffer written two
    kernels back is also done. Kernels launched without the attribute (cuBLAS, torch's own, copies)
    wait for full completion anyway.

    gdc_launch_dependents (the early trigger) right after the wait: the next grid may be scheduled
    once every program of this one has triggered or exited, i.e. once all of them are resident.
    Safe at any point, since the trigger orders nothing: the next kernel's own gdc_wait still waits
    for this grid's completion and memory flush, not for the trigger. Placed as early as possible
    (the earliest point where it is true for every program) so the next kernel's launch and
    prologue overlap as much of this one's last wave as they can; it cannot delay this grid, whose
    programs are all resident by then (nor deadlock one that waits on its own programs: none
    here spins). The cost is the next grid's waiting programs holding registers and shared memory
    on SMs this grid's last wave no longer fills.
    """
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
