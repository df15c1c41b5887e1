"""`dlmrt quantize`: a bf16 checkpoint -> an NVFP4 (or FP8) checkpoint in the HF layout.

    dlmrt quantize --model DIR --format nvfp4 --out DIR-NVFP4 [--calibration FILE.jsonl | --task arithmetic]
    dlmrt quantize --model DIR --format fp8 --out DIR-FP8

nvfp4: the routed experts and dense MLPs (`nvfp4_writer.is_nvfp4_target`). With calibration
prompts, the model decodes them (eager mode, so every pass is seen) while `calibration.py` sums the
Hessian (16 x 16 diagonal blocks, or the diagonal with `--hessian diag`), and each block's scale is
searched under it (`nvfp4_scales.py`); without,
the scales are amax / 6. fp8: per-channel FP8 of every candidate (`writer.py`). OUT also gets
the calibration inputs' input scales (`nvfp4_writer.py`) and `quantize_report.json`: per quantized
tensor the relative layer-output error of the chosen scales
and of plain amax scales, side by side (under the calibration Hessian; without one, h = 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dlmrt.config import EAGER
from dlmrt.formats.nvfp4 import Nvfp4Weight, quantize_nvfp4
from dlmrt.quant.nvfp4_scales import output_error, search_nvfp4
from dlmrt.quant.quantize_config import REPORT, QuantizeConfig
from dlmrt.tasks import TASKS as _TASK_MODULES

__all__ = ["REPORT", "QuantizeConfig", "calibration_prompts", "run_quantize"]


def calibration_prompts(cfg: QuantizeConfig) -> list[str]:
    """The prompts of --calibration (a JSONL file) or --task; [] when neither is given."""
    if cfg.task is not None:
        it = _TASK_MODULES[cfg.task].iter_split("train")
        return [next(it).question for _ in range(cfg.samples)]
    if not cfg.calibration:
        return []
    path, prompts = Path(cfg.calibration), []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        text = next(
            (row[k] for k in ("prompt", "question", "text") if isinstance(row.get(k), str)), None
        )
        if text is None:
            raise ValueError(f"{path}:{i + 1}: no 'prompt', 'question' or 'text' string field")
        prompts.append(text)
    if not prompts:
        raise ValueError(f"{path}: no calibration prompts")
    return prompts[: cfg.samples]


def _hessians(cfg: QuantizeConfig, prompts: list[str]) -> tuple[dict, dict, Any]:
    """(Hessians by parameter name, input amaxes by parameter name, the model) from decoding."""
    from dlmrt.llm import LLM
    from dlmrt.quant.calibration import HessianHooks

    llm = LLM(cfg.model, device=cfg.device, mode=EAGER, skip_weight_check=True)
    hooks = HessianHooks(llm.model, blocks=cfg.hessian == "block")
    try:
        for p in tqdm(prompts, desc="calibrating", unit="prompt", disable=None):
            llm.generate(p, max_new_tokens=cfg.max_new_tokens)
    finally:
        hooks.remove()
    return hooks.diagonals(), hooks.amax, llm.model


class _Quantizer:
    """quantizer(stored name, tensor) for the writer; records the report."""

    def __init__(self, diag: dict, amax: dict, model: Any, search: bool) -> None:
        self.diag, self.amax, self.search, self.report = diag, amax, search, {}
        self.slices = model.checkpoint_slices() if hasattr(model, "checkpoint_slices") else {}
        self.rename = getattr(type(model), "checkpoint_name", None) if model is not None else None

    def _lookup(self, table: dict, name: str) -> torch.Tensor | None:
        """The entry of stored tensor `name` (per-expert tensors: their expert's slice)."""
        if name in self.slices:
            param, index = self.slices[name]
            h = table.get(param)
            return None if h is None else h[index]
        mapped = self.rename(name) if self.rename is not None else name
        return table.get(mapped)

    def _h(self, name: str, w: torch.Tensor) -> torch.Tensor | None:
        return self._lookup(self.diag, name)

    def input_amax(self, name: str) -> torch.Tensor | None:
        return self._lookup(self.amax, name)

    def __call__(self, name: str, w: torch.Tensor) -> Nvfp4Weight:
        h = self._h(name, w)
        plain = quantize_nvfp4(w)
        ones = torch.ones(*w.shape[:-2], w.shape[-1])
        if h is None or not self.search:
            q, how = plain, "amax"
        else:
            q, how = (
                search_nvfp4(w, h),
                "hessian-" + ("diag" if h.dim() == w.dim() - 1 else "block"),
            )
        weight = ones if h is None else h
        self.report[name] = {
            "scales": how,
            "rel_output_error": output_error(w, q, weight),
            "amax_rel_output_error": output_error(w, plain, weight),
            "hessian": h is not None,
        }
        return q


def run_quantize(cfg: QuantizeConfig) -> Path:
    """Write the quantized checkpoint (and its report) to cfg.out; returns its path."""
    from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint
    from dlmrt.quant.writer import write_fp8_checkpoint

    src, out = Path(cfg.model), Path(cfg.out)
    if cfg.format == "fp8":
        return write_fp8_checkpoint(src, out, fmt=cfg.layout)
    prompts = calibration_prompts(cfg)
    diag, amax, model = _hessians(cfg, prompts) if prompts else ({}, {}, None)
    quantizer = _Quantizer(diag, amax, model, cfg.hessian != "none")
    write_nvfp4_checkpoint(
        src, out, fmt=cfg.layout, quantizer=quantizer, input_amax=quantizer.input_amax
    )
    summary = {
        "format": cfg.format,
        "layout": cfg.layout,
        "calibration_prompts": len(prompts),
        "hessian": cfg.hessian if prompts else None,
        "tensors": quantizer.report,
    }
    (out / REPORT).write_text(json.dumps(summary, indent=2))
    return out
