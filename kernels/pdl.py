"""Programmatic dependent launch (PDL) for the round's Triton kernels: one switch.

With `ENABLED` (set once by `dlmrt.ops` from DLMRT_PDL), each kernel is launched with
`launch_pdl=True` (Triton 3.6: the launch carries the programmatic stream serialization attribute,
kept when a graph is captured) and waits for its producer with `tl.extra.cuda.gdc_wait()` before
its first load, so its launch and prologue overlap the previous kernel's tail. Hopper or newer.
"""

ENABLED = False


def launch() -> dict[str, bool]:
    """Keyword arguments of a kernel launch: the kernel's PDL constexpr and Triton's launch flag."""
    return {"PDL": ENABLED, "launch_pdl": ENABLED}
