"""The start model of an ORL run: a trainable QwenDLM with an ORL adapter (paper Appendix C).

An existing adapter is kept; `gamma` rescales it once without changing its function
(`rescale_residual_adapter`: W_g, W_u, W_d times gamma, both scales divided by gamma), before the
optimizer exists, never on resume (a resumed run loads its own rescaled config.json). Without an
adapter one is added: gate/up ~ N(0, adapter_init_std), down = 0 (so g(z) = 0: the model's
function is unchanged), norm gain 1.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from dlmrt import models
from dlmrt.loading.tensors import check_layer_count, tensor_shapes
from dlmrt.models.config import model_config_from_hf
from dlmrt.models.qwen_dlm import QwenDLM
from dlmrt.models.residual import ResidualConfig, rescale_residual_adapter
from dlmrt.train.model import build_model, state_tensors
from dlmrt.train.orl.config import ORLConfig

log = logging.getLogger("dlmrt")
ADAPTER = "model.residual_adapter."


def read_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"--model: {path} is not a checkpoint directory (no config.json)")
    raw = json.loads(cfg_path.read_text())
    arch = (raw.get("architectures") or ["?"])[0]
    if models.ARCHITECTURES.get(arch) is not models.QWEN_DLM:
        raise ValueError(
            f"--model: {path} is a {arch} checkpoint; ORL trains QwenDLM-format models"
        )
    return raw


def _weights(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"--model: {path} has no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


@torch.no_grad()
def init_adapter(model: QwenDLM, std: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    a = model.adapter
    for proj in (a.gate_proj, a.up_proj):
        proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) * std)
    a.down_proj.weight.zero_()
    a.norm.weight.fill_(1.0)


@torch.no_grad()
def load_trainable(
    path: Path,
    raw: dict[str, Any],
    device: torch.device,
    seed: int,
    allow_missing_adapter: bool = False,
) -> QwenDLM:
    """`raw`'s model with `path`'s weights, unfused, fp32, requiring grad."""
    config = model_config_from_hf(raw, path)
    headers = tensor_shapes(sorted(path.glob("*.safetensors")))  # before the model is built
    check_layer_count(config.num_hidden_layers, headers, path / "config.json")
    model = build_model(config, device, seed)
    tensors, expected = _weights(path), state_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    if allow_missing_adapter:
        missing = [n for n in missing if not n.startswith(ADAPTER)]
    unexpected = sorted(set(tensors) - set(expected) - {"lm_head.weight"})
    if missing or unexpected:
        raise ValueError(f"{path}: missing weights {missing[:4]}, unexpected {unexpected[:4]}")
    params = model.state_dict()
    for name in expected:
        if name in tensors:
            params[name].copy_(tensors[name])
    return model


def start_model(cfg: ORLConfig, path: Path, device: torch.device):
    """(model, its config.json dict) for a new run from checkpoint `path`."""
    raw = read_config(path)
    added = "orl_residual" not in raw
    if added:
        inter = cfg.adapter_intermediate_size or raw["intermediate_size"]
        new = ResidualConfig(
            intermediate_size=inter,
            positions=cfg.adapter_positions,
            post_norm_scale=cfg.adapter_post_norm_scale,
        )
        raw = {**raw, "orl_residual": dataclasses.asdict(new)}
    elif cfg.adapter_post_norm_scale is not None:
        raise ValueError(
            f"adapter_post_norm_scale: sets a new adapter's post-norm; {path} has an adapter "
            "(its post-norm is its config's orl_residual.post_norm_scale)"
        )
    model = load_trainable(path, raw, device, cfg.seed, allow_missing_adapter=added)
    if added:
        init_adapter(model, cfg.adapter_init_std, cfg.seed)
        log.warning(
            "%s has no ORL adapter: added one (width %d) with a zero output projection",
            path,
            raw["orl_residual"]["intermediate_size"],
        )
    if cfg.gamma is not None:
        if added:
            raise ValueError("gamma: rescales an existing adapter; the start model has none")
        new = rescale_residual_adapter(model.adapter, cfg.gamma)
        model.cfg = dataclasses.replace(model.cfg, residual=new)
        raw = {**raw, "orl_residual": dataclasses.asdict(new)}
        log.info("adapter rescaled by gamma = %g (same function)", cfg.gamma)
    return model, raw
