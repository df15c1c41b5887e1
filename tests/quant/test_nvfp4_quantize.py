"""`dlmrt quantize`: the local-Hessian block-scale search, calibration, the CLI end to end."""

from __future__ import annotations

import json

import pytest
import torch
from nvfp4_helpers import nvfp4_sources
from safetensors.torch import load_file

from dlmrt.cli import main
from dlmrt.demo import demo_model_path
from dlmrt.formats.nvfp4 import Nvfp4Weight, quantize_nvfp4
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.quant.nvfp4_scales import output_error, search_nvfp4
from dlmrt.quant.quantize import QuantizeConfig

CPU = torch.device("cpu")


def test_search_finds_the_known_best_scale():
    """Block 0: the outlier 8.0 has no weight in H, 6.0 has; at scale 1.0 (c = 0.75 of amax / 6) 6.0
    is exact, at the amax scale it is not. Block 1 (amax 42) fixes the global scale at 1/64."""
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1], w[0, 16] = 8.0, 6.0, 42.0
    h = torch.zeros(32)
    h[1], h[16] = 1.0, 1.0
    plain, best = quantize_nvfp4(w), search_nvfp4(w, h)
    assert plain.global_scale.item() == 1 / 64
    assert best.scales()[0, 0].item() == 1.0 and plain.scales()[0, 0].item() != 1.0
    assert best.dequantize(torch.float32)[0, 1].item() == 6.0
    assert output_error(w, best, h) == 0.0 < output_error(w, plain, h)


def test_local_hessian_search_beats_amax_on_the_layer_output_error():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen)
    x = torch.randn(512, 128, generator=gen) * torch.rand(128, generator=gen) * 3  # uneven inputs
    h = (x**2).sum(0)
    y = x @ w.t()

    def err(q: Nvfp4Weight) -> float:
        return ((x @ q.dequantize(torch.float32).t() - y).norm() ** 2 / y.norm() ** 2).item()

    assert err(search_nvfp4(w, h)) < 0.85 * err(quantize_nvfp4(w))
    with pytest.raises(
        ValueError, match="Hessian of shape \\[64\\], expected a diagonal \\[128\\]"
    ):
        search_nvfp4(w, h[:64])


def test_block_hessian_beats_the_diagonal_when_inputs_correlate_within_blocks():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen)
    mix = torch.block_diag(
        *[torch.eye(16) + 0.9 * torch.randn(16, 16, generator=gen) for _ in range(8)]
    )
    x = torch.randn(1024, 128, generator=gen) @ mix
    xb = x.unflatten(-1, (-1, 16))
    diag, blocks = (x**2).sum(0), torch.einsum("tbi,tbj->bij", xb, xb)
    y = x @ w.t()

    def err(q: Nvfp4Weight) -> float:
        return ((x @ q.dequantize(torch.float32).t() - y).norm() ** 2 / y.norm() ** 2).item()

    amax, d, b = err(quantize_nvfp4(w)), err(search_nvfp4(w, diag)), err(search_nvfp4(w, blocks))
    assert b < 0.95 * d < 0.95 * amax
    # X has no cross-block correlation (up to sampling): the block objective is the output error
    assert output_error(w, search_nvfp4(w, blocks), blocks) == pytest.approx(b, rel=1e-2)


def _prompts(path):
    path.write_text("\n".join(json.dumps({"prompt": f"{i}+{i + 3}="}) for i in range(2)))
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return nvfp4_sources(tmp_path_factory.mktemp("qsrc"))


@pytest.mark.slow  # decodes the calibration prompts on the CPU
@pytest.mark.parametrize("family", ["llada2", "dg"])
def test_cli_nvfp4_with_calibration_end_to_end(sources, tmp_path, family, capsys):
    out = tmp_path / "q"
    argv = [
        "quantize",
        "--model",
        str(sources[family]),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--calibration",
        str(_prompts(tmp_path / "p.jsonl")),
        "--max-new-tokens",
        "4",
        "--layout",
        "compressed-tensors" if family == "dg" else "modelopt",
    ]
    assert main(argv) == 0
    assert "tensors in NVFP4" in capsys.readouterr().out
    report = json.loads((out / "quantize_report.json").read_text())
    assert report["calibration_prompts"] == 2 and report["hessian"] == "block"
    tensors = report["tensors"]
    assert any(t["hessian"] for t in tensors.values())  # routed-to experts and dense MLPs
    for name, t in tensors.items():  # the search never loses to amax on its own objective
        assert t["rel_output_error"] <= t["amax_rel_output_error"] + 1e-9, name
    tensors_out = load_file(str(out / "model.safetensors"))
    suffix = "input_global_scale" if family == "dg" else "input_scale"
    inputs = [n for n in tensors_out if n.endswith(suffix)]
    assert inputs and all(tensors_out[n].dtype == torch.float32 for n in inputs)
    assert all((tensors_out[n] > 0).all() for n in inputs)
    ckpt = load_checkpoint(out, torch.float32, CPU)  # the input scales are dropped
    assert ckpt.quantized and all(isinstance(w, Nvfp4Weight) for w in ckpt.quantized.values())
    assert (out / "tokenizer.json").is_file()


@pytest.mark.slow
def test_cli_demo_model_fp8_and_nvfp4_task(tmp_path):
    from dlmrt import LLM

    assert (
        main(
            [
                "quantize",
                "--model",
                str(demo_model_path()),
                "--format",
                "fp8",
                "--out",
                str(tmp_path / "fp8"),
            ]
        )
        == 0
    )
    assert load_checkpoint(tmp_path / "fp8", torch.float32, CPU).quantized
    assert (
        main(
            [
                "quantize",
                "--model",
                str(demo_model_path()),
                "--task",
                "arithmetic",
                "--samples",
                "2",
                "--max-new-tokens",
                "8",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "nv"),
            ]
        )
        == 0
    )
    llm = LLM(tmp_path / "nv", device="cpu")
    assert llm.generate("Tom has 3 apples and buys 4 more. How many?", max_new_tokens=16).token_ids


@pytest.mark.parametrize("kw, message", [
    ({"format": "int4"}, "format: expected one of nvfp4, fp8"),
    ({"task": "arithmetic", "calibration": "x.jsonl"}, "not both"),
    ({"format": "fp8", "task": "arithmetic"}, "fp8 takes no calibration"),
    ({"out": None}, "--model and --out are required"),
])  # fmt: skip
def test_bad_quantize_config(kw, message):
    with pytest.raises(ValueError, match=message):
        QuantizeConfig(**({"model": "m", "out": "o"} | kw))


def test_calibration_prompts_come_from_any_registered_task():
    from dlmrt.quant.quantize import QuantizeConfig, calibration_prompts
    from dlmrt.tasks import arithmetic_chain

    it = arithmetic_chain.iter_split("train")
    want = [next(it).question for _ in range(3)]
    cfg = QuantizeConfig(model="m", out="o", task="arithmetic_chain", samples=3)
    assert calibration_prompts(cfg) == want
    with pytest.raises(ValueError, match="task: expected one of"):
        QuantizeConfig(model="m", out="o", task="poetry")
