"""A random-weight DiffusionGemma NVFP4 checkpoint (ModelOpt layout), written fast and layer by layer.

`write_random_nvfp4(path, layers, tiny)` writes what `dlmrt quantize --format nvfp4` would write
for a DiffusionGemma of those widths (`peer_transformers.text_config`: the 26B-A4B's, or tiny
ones), without any bf16 model: the NVFP4 targets (routed experts, dense MLPs:
`nvfp4_writer.is_nvfp4_target`) get random packed E2M1 codes (every byte is two valid codes),
random e4m3 block scales in [0.5, 1] and a global scale that makes the weights' RMS about 0.02;
every other weight N(0, 0.02) in bf16, buffers (the layer scalars) 1. One safetensors file per
layer (about 0.45 GB at full size) and one for the rest, an index, `config.json` (the HF text
config that `diffusion_gemma_config_from_hf` parses), `hf_quant_config.json` (`exclude_modules`:
every linear left unquantized) and `generation_config.json`. The tensor names are
transformers' (`model.decoder.layers.N...`); the model's names and shapes come from a meta build.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from benchmarks.rounds.peer_transformers import text_config
from dlmrt.formats.fp8 import FP8
from dlmrt.formats.nvfp4 import BLOCK
from dlmrt.loading.nvfp4_reader import stored_names
from dlmrt.loading.policy import UNQUANTIZED_LINEARS, classify, module_names
from dlmrt.loading.quant_config import MODELOPT
from dlmrt.model_shapes import diffusion_gemma_26b
from dlmrt.models.diffusion_gemma import DiffusionGemma
from dlmrt.models.diffusion_gemma_config import diffusion_gemma_config_from_hf
from dlmrt.quant.nvfp4_writer import is_nvfp4_target, write_quant_config
from dlmrt.quant.writer import INDEX

CODE_RMS = 2.93  # RMS of an E2M1 code drawn uniformly from the 16 (magnitudes 0 ... 6)
WEIGHT_RMS = 0.02


def hf_config(layers: int, tiny: bool) -> dict:
    """config.json of the checkpoint (the fields dlmrt's DiffusionGemma parser reads)."""
    text = text_config(layers, tiny) | dict(
        hidden_activation="gelu_pytorch_tanh",
        attention_bias=False,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "canvas_length": 32 if tiny else diffusion_gemma_26b().canvas_length,
        "eos_token_id": [1],
        "tie_word_embeddings": True,
        "text_config": text,
    }


def _stored(name: str) -> str:
    """transformers' name of one of the model's tensors (`DiffusionGemma.checkpoint_name` inverted)."""
    rest = name.removeprefix("model.")
    if rest.endswith(".encoder_layer_scalar"):
        return "model.encoder.language_model." + rest.replace(
            ".encoder_layer_scalar", ".layer_scalar"
        )
    return "model.decoder." + rest


def _nvfp4(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """Random packed codes, block scales and global scale(s) of one weight [.., N, K], stored."""
    *rows, k = shape
    packed = torch.from_numpy(rng.integers(0, 256, (*rows, k // 2), dtype=np.uint8))
    block = torch.from_numpy(rng.uniform(0.5, 1.0, (*rows, k // BLOCK)).astype(np.float32))
    glob = torch.full(rows[:1] if len(rows) == 2 else (), WEIGHT_RMS / (CODE_RMS * 0.75))
    w, b, g = stored_names(name, MODELOPT)
    return {w: packed, b: block.to(FP8), g: glob}


def _group(name: str) -> str:
    """The file a tensor goes to: its layer's, or the rest's."""
    parts = name.split(".")
    return f"layer-{int(parts[2]):03d}" if parts[1] == "layers" else "rest"


def write_random_nvfp4(path: Path, layers: int, tiny: bool = False, seed: int = 0) -> Path:
    """Write the checkpoint at `path` (a new or empty directory); returns `path`."""
    path.mkdir(parents=True, exist_ok=True)
    raw = hf_config(layers, tiny)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1]}))
    cfg = diffusion_gemma_config_from_hf(raw, path / "config.json")
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in DiffusionGemma(cfg).state_dict().items()}
    shapes.pop("lm_head.weight")  # tied to the embeddings
    buffers = {n for n in shapes if n.endswith("layer_scalar")}
    groups: dict[str, list[str]] = {}
    for name in shapes:
        groups.setdefault(_group(name), []).append(name)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    weight_map, kept = {}, set()
    for group, names in groups.items():
        tensors: dict[str, torch.Tensor] = {}
        for name in names:
            stored, shape = _stored(name), shapes[name]
            if is_nvfp4_target(name) and shape[-1] % BLOCK == 0:
                tensors |= _nvfp4(stored, shape, rng)
                continue
            linear, why = classify(name)
            if linear or why in UNQUANTIZED_LINEARS:
                kept.add(module_names(stored)[0])
            t = torch.empty(shape, dtype=torch.bfloat16)
            tensors[stored] = (
                t.fill_(1) if name in buffers else t.normal_(0, WEIGHT_RMS, generator=gen)
            )
        save_file(tensors, str(path / f"{group}.safetensors"))
        weight_map |= {n: f"{group}.safetensors" for n in tensors}
    (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    write_quant_config(path, MODELOPT, sorted(kept))
    return path
