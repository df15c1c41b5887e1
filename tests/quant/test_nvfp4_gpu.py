"""GPU: the shipped demo model through `dlmrt quantize --format nvfp4 --task arithmetic` (its MLPs in
NVFP4, on the dense W4A16 kernel: QwenDLM has no routed experts), 300 held-out problems: accuracy
within 2 points of bf16, tokens per forward within 5%; local-Hessian (16 x 16 blocks, diagonal) and
plain amax scales side by side.

Run on the device machine: pytest -m gpu -s tests/quant/test_nvfp4_gpu.py
"""

from __future__ import annotations

import json

import pytest
import torch

from dlmrt import LLM
from dlmrt.quant.quantize import REPORT, QuantizeConfig, run_quantize

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_demo_model_accuracy_and_tpf_hold_in_nvfp4(tmp_path):
    from dlmrt.demo import demo_model_path
    from dlmrt.tasks import arithmetic
    from dlmrt.train.evaluate import evaluate

    demo = str(demo_model_path())
    paths = {"bf16": demo}
    for hessian in ("block", "diag", "none"):
        cfg = QuantizeConfig(
            model=demo,
            out=str(tmp_path / hessian),
            task="arithmetic",
            samples=64,
            hessian=hessian,
            device="cuda",
        )
        paths[f"nvfp4_{hessian}"] = str(run_quantize(cfg))
    results = {k: evaluate(LLM(p, device="cuda"), arithmetic, 300) for k, p in paths.items()}
    errors = {}
    for k in ("nvfp4_block", "nvfp4_diag", "nvfp4_none"):
        tensors = json.loads((tmp_path / k.removeprefix("nvfp4_") / REPORT).read_text())["tensors"]
        errors[k] = sum(t["rel_output_error"] for t in tensors.values()) / len(tensors)
    print({k: (r["accuracy"], round(r["tokens_per_forward"], 3)) for k, r in results.items()})
    print("mean relative output error", errors)
    bf16 = results["bf16"]
    for k in ("nvfp4_block", "nvfp4_diag", "nvfp4_none"):
        assert abs(results[k]["accuracy"] - bf16["accuracy"]) <= 0.02, k
        assert abs(results[k]["tokens_per_forward"] / bf16["tokens_per_forward"] - 1) <= 0.05, k
    assert errors["nvfp4_diag"] < errors["nvfp4_none"]  # each under its own Hessian
