"""Compile a Triton kernel for Hopper (sm_90) on a machine without a GPU and summarise its IR.

    python -m benchmarks.kernels.kernel_ir [PRESET ...] [--dump DIR]

Device time is scarce; what Triton makes of a kernel is not. `triton.compile` with a
`GPUTarget("cuda", 90, 32)` runs the whole pipeline down to a cubin on the CPU (Triton ships
ptxas), given each argument's type and the 16-divisibility the launcher would infer for
pointers and strides. The summary names the MMA kind (`wgmma`: Hopper's warp-group MMA; `mma_v2`:
the Ampere-style instruction), how many loads the software pipeliner turned into asynchronous
copies, the layout conversions and the shared memory. This is how the NVFP4 expert kernel's
missing wgmma was found (docs/kernels.md: "Tile orientation"). Presets are the expert kernels at
LLaDA-2.1-mini's 32-row round; --dump writes each preset's TTGIR and PTX.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

PRESETS = {  # name: (module in kernels/, kernel, argument types, constexprs, warps, stages)
    "moe_bf16": ("moe_mlp", "_gate_up_kernel",
                 {"x_ptr": "*bf16", "gate_ptr": "*bf16", "up_ptr": "*bf16", "h_ptr": "*bf16",
                  "gate_scale_ptr": "*fp32", "up_scale_ptr": "*fp32"},
                 dict(H=2048, INTER=512, TOP_K=8, E=256, E_PAD=256, GELU=False, IEEE=False,
                      BM=16, BN=64, BK=128, SCALED=False, SWAP=False), 4, 3),
    "moe_nvfp4": ("moe_mlp_nvfp4", "_gate_up_kernel",
                  {"x_ptr": "*bf16", "h_ptr": "*bf16", "gw_ptr": "*u8", "uw_ptr": "*u8",
                   "gs_ptr": "*fp8e4nv", "us_ptr": "*fp8e4nv", "gg_ptr": "*fp32",
                   "ug_ptr": "*fp32"},
                  dict(H=2048, INTER=512, TOP_K=8, E=256, E_PAD=256, GELU=False, IEEE=False,
                       BM=16, BN=64, BK=128, SWAP=True), 4, 3),
}  # fmt: skip
PRESETS["moe_nvfp4_noswap"] = PRESETS["moe_nvfp4"][:3] + (
    {**PRESETS["moe_nvfp4"][3], "SWAP": False}, 4, 3,
)  # fmt: skip


def compile_sm90(fn, types: dict, consts: dict, warps: int, stages: int):
    """The compiled kernel (`.asm` holds ttir / ttgir / ptx / cubin). Arguments not in `consts`
    or `types` are *i32 pointers (names ending in _ptr) or i32 scalars; pointers and strides are
    marked 16-divisible, as the launcher marks them for aligned tensors."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            signature[name] = "constexpr"
            continue
        signature[name] = types.get(name, "*i32" if name.endswith("_ptr") else "i32")
        if name.endswith("_ptr") or name.startswith("stride"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, consts, attrs)
    options = {"num_warps": warps, "num_stages": stages}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def summary(kernel) -> dict:
    ir = kernel.asm["ttgir"]
    return {
        "mma": "wgmma" if "warp_group_dot" in ir else ("mma_v2" if "tt.dot" in ir else "none"),
        "async_copies": ir.count("async_copy_global_to_local"),
        "layout_conversions": ir.count("convert_layout"),
        "shared_allocs": ir.count("local_alloc"),
        "shared_bytes": kernel.metadata.shared,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "presets", nargs="*", metavar="PRESET", help=f"default all: {', '.join(PRESETS)}"
    )
    ap.add_argument("--dump", type=Path, default=None, help="write <preset>.ttgir / .ptx here")
    args = ap.parse_args()
    for name in args.presets or list(PRESETS):
        if name not in PRESETS:
            ap.error(f"unknown preset {name!r} (one of {', '.join(PRESETS)})")
        module, kernel_name, types, consts, warps, stages = PRESETS[name]
        fn = getattr(importlib.import_module(f"dlmrt._kernels.{module}"), kernel_name)
        kernel = compile_sm90(fn, types, consts, warps, stages)
        print(name, summary(kernel))
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{name}.ttgir").write_text(kernel.asm["ttgir"])
            (args.dump / f"{name}.ptx").write_text(kernel.asm["ptx"])


if __name__ == "__main__":
    main()
