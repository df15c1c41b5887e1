"""Our ModelOpt NVFP4 export (`dlmrt/quant/nvfp4_writer.py`) vs ModelOpt's own, for the same layer
of the same tiny Qwen3: the same tensor names, shapes and dtypes (weight uint8 [N, K/2],
weight_scale e4m3 [N, K/16], weight_scale_2 fp32 scalar) and the same declared scheme. Needs the
optional `[quant]` extra (nvidia-modelopt); skipped without it.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_qwen3_config
from safetensors import safe_open

from dlmrt.quant.nvfp4_writer import write_nvfp4_checkpoint

mtq = pytest.importorskip("modelopt.torch.quantization")
export = pytest.importorskip("modelopt.torch.export")
LAYER = "model.layers.0.mlp.gate_proj"


def _tensors(path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    out = {}
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                if name.startswith(LAYER + "."):
                    t = st.get_tensor(name)
                    out[name] = (tuple(t.shape), t.dtype)
    return out


@pytest.mark.slow
def test_our_nvfp4_layout_matches_modelopt_export(tmp_path):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(tiny_qwen3_config()).eval()
    hf.save_pretrained(tmp_path / "src")
    ours = write_nvfp4_checkpoint(tmp_path / "src", tmp_path / "ours")
    ids = torch.randint(0, hf.config.vocab_size, (2, 32))
    mtq.quantize(hf, mtq.NVFP4_DEFAULT_CFG, forward_loop=lambda m: m(ids))
    # dtype given: ModelOpt 0.47 reads transformers 5's config.dtype, a string, as a torch dtype
    export.export_hf_checkpoint(hf, dtype=torch.float32, export_dir=tmp_path / "modelopt")
    theirs = _tensors(tmp_path / "modelopt")
    mine = _tensors(ours)
    names = [f"{LAYER}.weight", f"{LAYER}.weight_scale", f"{LAYER}.weight_scale_2"]
    for name in names:
        assert name in theirs and name in mine, name
        assert theirs[name] == mine[name], (name, theirs[name], mine[name])
    assert set(mine) <= set(theirs)  # ModelOpt also writes input_scale (W4A4); we do not
    mo = json.loads((tmp_path / "modelopt" / "hf_quant_config.json").read_text())["quantization"]
    ours_q = json.loads((ours / "hf_quant_config.json").read_text())["quantization"]
    assert mo["quant_algo"] == ours_q["quant_algo"] == "NVFP4"
    assert mo.get("group_size", 16) == ours_q["group_size"] == 16
