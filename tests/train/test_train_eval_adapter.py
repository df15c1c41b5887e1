"""`dlmrt train eval --adapter off`: the residual pathway's ablation (issue 39)."""

from __future__ import annotations

import json

import torch

from dlmrt.cli import main
from dlmrt.llm import LLM
from dlmrt.models.residual import ResidualAdapter
from dlmrt.tasks import get_task
from dlmrt.train.evaluate import evaluate

GENERATE = LLM.generate
FLAGS = ["--problems", "2", "--max-new-tokens", "24", "--device", "cpu", "--dtype", "float32"]


def _record(monkeypatch) -> list[list[int]]:
    """From now on, the tokens of every `LLM.generate` answer, in order (this list only)."""
    tokens: list[list[int]] = []

    def spy(self, *args, **kw):
        out = GENERATE(self, *args, **kw)
        tokens.append(list(out.token_ids))
        return out

    monkeypatch.setattr(LLM, "generate", spy)
    return tokens


def _cli_eval(monkeypatch, tmp_path, model, *flags) -> tuple[dict, list[list[int]]]:
    """The JSON result of `dlmrt train eval` and the tokens of each problem's answer."""
    tokens, path = _record(monkeypatch), tmp_path / "eval.json"
    assert main(["train", "eval", "--model", str(model), *FLAGS, "--out", str(path), *flags]) == 0
    return json.loads(path.read_text()), tokens


def test_adapter_off_equals_a_zero_adapter_output_and_differs_from_on(
    orl_ckpt, tmp_path, monkeypatch
):
    on, on_tokens = _cli_eval(monkeypatch, tmp_path, orl_ckpt)
    off, off_tokens = _cli_eval(monkeypatch, tmp_path, orl_ckpt, "--adapter", "off")
    assert on["adapter"] == "on" and off["adapter"] == "off"
    assert off_tokens != on_tokens  # the tiny model's random adapter changes its answers
    # the reference: the same checkpoint and problems with g(z) = 0 by construction
    monkeypatch.setattr(ResidualAdapter, "forward", lambda self, z: torch.zeros_like(z))
    ref_tokens = _record(monkeypatch)
    ref = evaluate(
        LLM(orl_ckpt, device="cpu", dtype="float32"), get_task("arithmetic"), 2, max_new_tokens=24
    )
    assert off_tokens == ref_tokens
    for key in ("accuracy", "generated_tokens", "denoising_forwards"):
        assert off[key] == ref[key], key


def test_adapter_off_needs_an_adapter(base_ckpt, capsys):
    assert main(["train", "eval", "--model", str(base_ckpt), *FLAGS, "--adapter", "off"]) == 2
    assert "has no ORL residual adapter" in capsys.readouterr().err
