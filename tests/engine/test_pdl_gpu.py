"""GPU (Hopper or newer): DLMRT_PDL=1 and =nogemm give DLMRT_PDL=0's tokens in block_graph, every family.

`dlmrt.ops` sets the kernels' switch (kernels/pdl.py) once per process, from the environment,
at the first op it resolves, so each setting runs in a subprocess of its own (the two at once).
The cases reach every kernel family a round or step launches: QwenDLM + ORL (norms, RoPE, arena
attention, SiLU, statistics), LLaDA2 (its router, expert plan, expert MLP, slot sum), both again
in FP8 with the Triton FP8 GEMM and the W8A8 experts pinned (quantizers, split-K GEMM, expert
quantizer), DiffusionGemma (canvas attention, canvas vocabulary, Gemma norms, softmax router).

Run on the device machine: pytest -m gpu tests/engine/test_pdl_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 9,
        reason="PDL needs Hopper or newer",
    ),
]
# no optional library where a measurement would pick it in one process and not the other
PINS = dict(DLMRT_FA4="off", DLMRT_DEEPGEMM="off")
# FP8 cases: the Triton kernels in every linear, whatever tiny shapes would measure faster
FP8_ENV = dict(DLMRT_FP8_GEMMS="all", DLMRT_FP8_GEMM_KERNEL="triton", DLMRT_FP8_EXPERTS="w8a8")
FP8_ENV |= dict(DLMRT_FP8_GLU="on")  # gate|up + SwiGLU in one kernel
WIDE = dict(vocab_size=512, hidden_size=256, intermediate_size=512, head_dim=64)  # FP8 widths
MARK = "PDL_TOKENS "
# the child: one LLM in block_graph; its requests' tokens, the switch as the kernels saw it, and
# what every start-up choice picked. FP8: one config per FP8 kernel, so that no measurement can
# give the two processes different tiles or K splits (different sums, not a PDL effect)
CHILD = f"""
import json, sys
import dlmrt._kernels.pdl as pdl
from dlmrt import LLM
from dlmrt.ops import choices, fp8_choice, fp8_glu_choice
args = json.loads(sys.argv[1])
many, glu = fp8_choice.candidates, fp8_glu_choice.glu_configs
fp8_choice.candidates = lambda *a: [max(many(*a), key=lambda c: (c[3], c[6]))]  # most K splits
fp8_glu_choice.glu_configs = lambda rows: glu(rows)[:1]
llm = LLM(args["path"], device="cuda", dtype="bfloat16", mode="block_graph",
          quantization=args["quant"])
tokens = [llm.generate(prompt, **kw).token_ids for prompt, kw in args["requests"]]
picks = [[c.what, c.pick] for c in choices.recorded() if c.what != "programmatic dependent launch"]
print({MARK!r} + json.dumps({{"pdl": pdl.ENABLED, "gemms": pdl.GEMMS, "tokens": tokens, "picks": picks}}))
"""


def _prompt(n: int) -> list[int]:
    return [(37 * i + 11) % 256 for i in range(n)]


def _block_requests(rule: str) -> list:
    kw = dict(rule=rule, block_length=4, max_new_tokens=16, ignore_eos=True)
    kw |= {"threshold": 0.25} if rule == "threshold" else {}
    sampled = kw | dict(temperature=0.8, seed=3)
    return [[_prompt(9), kw], [_prompt(38), kw], [_prompt(22), sampled]]


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    """name -> (checkpoint, quantization, requests, extra environment)."""
    root = tmp_path_factory.mktemp("pdl")
    qwen = write_checkpoint(root / "q", residual=residual_config(), **WIDE)
    llada = write_llada2_checkpoint(root / "l", vocab_size=512)
    out = {
        "qwen-orl": (qwen, None, _block_requests("threshold"), {}),
        "llada2": (llada, None, _block_requests("llada_editing"), {}),
        "qwen-orl-fp8": (qwen, "fp8", _block_requests("threshold"), FP8_ENV),
        "llada2-fp8": (llada, "fp8", _block_requests("llada_editing"), FP8_ENV),
    }
    try:
        from dg_helpers import SETTINGS, tiny_checkpoint
        from dg_helpers import _prompt as dg_prompt
    except pytest.skip.Exception:  # transformers without DiffusionGemma
        return out
    requests = [
        [dg_prompt(plen, seed), dict(max_new_tokens=new, seed=seed, rng="counter", **SETTINGS[k])]
        for seed, (plen, new, k) in enumerate([(3, 20, 0), (13, 40, 3)])
    ]
    out["diffusion-gemma"] = (tiny_checkpoint(tmp_path_factory)[0], None, requests, {})
    return out


def _start(flag: str, path, quant, requests, env: dict) -> subprocess.Popen:
    args = json.dumps({"path": str(path), "quant": quant, "requests": requests})
    child_env = os.environ | PINS | env | {"DLMRT_PDL": flag}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, args], env=child_env, stdout=subprocess.PIPE, text=True
    )


def _result(proc: subprocess.Popen, flag: str) -> dict:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"DLMRT_PDL={flag}: child exited {proc.returncode}"
    (line,) = [x for x in out.splitlines() if x.startswith(MARK)]
    return json.loads(line[len(MARK) :])


@pytest.mark.parametrize(
    "name", ["qwen-orl", "llada2", "qwen-orl-fp8", "llada2-fp8", "diffusion-gemma"]
)
def test_pdl_gives_the_same_tokens(cases, name):
    if name not in cases:
        pytest.skip("transformers has no DiffusionGemma")
    procs = {flag: _start(flag, *cases[name]) for flag in ("0", "1", "nogemm")}
    results = {flag: _result(proc, flag) for flag, proc in procs.items()}
    assert results["0"]["pdl"] is False and results["1"]["pdl"] is True
    assert results["1"]["gemms"] is True
    assert results["nogemm"]["pdl"] is True and results["nogemm"]["gemms"] is False
    assert all(results["0"]["tokens"]), "a request produced no tokens"
    for flag in ("1", "nogemm"):
        assert results[flag]["picks"] == results["0"]["picks"], f"{flag}: chose differently"
        assert results[flag]["tokens"] == results["0"]["tokens"], f"{name}, DLMRT_PDL={flag}"
