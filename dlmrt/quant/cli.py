"""`dlmrt quantize`: its flags derive from the `QuantizeConfig` fields (dlmrt/quant/quantize.py)."""

from __future__ import annotations

import argparse
import json

from dlmrt.flags import add_dataclass_flags, values


def add_quantize_parser(sub: argparse._SubParsersAction) -> None:
    from dlmrt.quant.quantize_config import QuantizeConfig

    q = sub.add_parser(
        "quantize",
        help="write an NVFP4 or FP8 copy of a checkpoint",
        description="Quantize a bf16 checkpoint to NVFP4 (routed experts and dense MLPs; "
        "ModelOpt or compressed-tensors layout) or FP8 (per channel). With --calibration or "
        "--task, NVFP4 block scales are searched under the layer inputs' Hessian diagonal. OUT is "
        "a normal HF checkpoint (+ quantize_report.json).",
    )
    q.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    add_dataclass_flags(q, QuantizeConfig, "quantization (QuantizeConfig)")


def cmd_quantize(args: argparse.Namespace) -> int:
    from dlmrt.quant.quantize import REPORT, QuantizeConfig, run_quantize

    cfg = QuantizeConfig(**values(args, QuantizeConfig))
    out = run_quantize(cfg)
    report = out / REPORT
    if report.is_file():
        tensors = json.loads(report.read_text())["tensors"]
        errs = [t["rel_output_error"] for t in tensors.values()]
        amax = [t["amax_rel_output_error"] for t in tensors.values()]
        if errs:
            print(
                f"{len(errs)} tensors in NVFP4: mean relative output error "
                f"{sum(errs) / len(errs):.3e} (amax scales: {sum(amax) / len(amax):.3e})"
            )
    print(f"wrote {out}")
    return 0
