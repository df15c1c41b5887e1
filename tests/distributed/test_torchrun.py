"""`torchrun --nproc-per-node 2` (gloo, fp32): tiny QwenDLM (Base, ORL), LLaDA2 (Base, ORL) and
DiffusionGemma decode the same tokens sharded as on one process, for their rules and presets, greedy
and sampled; a rank that dies ends the job with an error on rank 0 within a bounded time.

One torchrun launch serves every request of a test (start-up dominates: ~10 s on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("tp_worker.py")
ROOT = Path(__file__).resolve().parents[2]
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33]  # "Hello, world!"


def _torchrun(job: dict, tmp: Path, timeout: float = 240, peer_s: int = 20):
    """(rank 0's JSON, seconds); peer_s: DLMRT_TP_TIMEOUT_S (GPU: Triton compiles take a while)."""
    (tmp / "job.json").write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env["DLMRT_TP_TIMEOUT_S"] = str(peer_s)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(job["world"])]
    cmd += ["--standalone", str(WORKER), str(tmp / "job.json"), str(tmp / "out.json")]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - t0
    out = tmp / "out.json"
    assert out.is_file(), f"rank 0 wrote nothing (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text()), elapsed


def _block_runs(tmp: Path) -> list[dict]:
    qwen_base = write_checkpoint(tmp / "qwen_base")
    qwen_orl = write_checkpoint(tmp / "qwen_orl", residual=residual_config())
    llada = write_llada2_checkpoint(tmp / "llada")
    llada_orl = write_llada2_checkpoint(tmp / "llada_orl", residual=residual_config())
    common = dict(max_new_tokens=24, ignore_eos=True)
    runs = []
    for model in (qwen_base, qwen_orl):
        runs.append((model, dict(common)))
        runs.append((model, dict(common, temperature=0.8, seed=3)))
        runs.append((model, dict(common, rule="entropy_budget", entropy_budget=1.0)))
    runs.append((qwen_base, dict(common, rule="threshold", threshold=0.5)))
    for model in (llada, llada_orl):
        runs.append((model, dict(common, editing="quality")))
        runs.append((model, dict(common, editing="speed", temperature=0.7, seed=5)))
    return [{"model": str(m), "prompt": PROMPT, "kwargs": kw} for m, kw in runs]


def _canvas_runs(tmp_path_factory) -> list[dict]:
    from dg_helpers import tiny_checkpoint

    path, _ = tiny_checkpoint(tmp_path_factory)
    runs = []
    for kw in (dict(rng="counter"), dict(seed=2), dict(rng="counter", seed=4)):
        runs.append(
            {
                "model": str(path),
                "prompt": [7, 30, 55, 12, 90, 41],
                "kwargs": dict(kw, max_new_tokens=16),
            }
        )
    return runs


def _one_process(runs: list[dict], device: str = "cpu", mode: str = "eager") -> list[dict]:
    llms: dict[str, LLM] = {}
    out = []
    for run in runs:
        if run["model"] not in llms:
            llms[run["model"]] = LLM(run["model"], mode=mode, device=device, dtype="float32")
        llm = llms[run["model"]]
        kwargs = dict(run["kwargs"])
        if llm.family.style != "block":
            kwargs.setdefault("rng", "counter")  # TP's default (torch draws need every logit)
        res = llm.generate(run["prompt"], **kwargs)
        vocab = llm.model.lm_head.weight.shape[0]
        out.append(
            {
                "token_ids": res.token_ids,
                "rounds_per_block": res.rounds_per_block,
                "finish_reason": res.finish_reason,
                "mode": res.mode,
                "cached": res.num_cached_tokens,  # repeated prompts: their first block is reused
                "lm_head_rows": vocab // 2,  # sharded: half the vocabulary on each rank
            }
        )
    return out


def test_tp2_decodes_the_tokens_of_one_process(tmp_path: Path, tmp_path_factory):
    runs = _block_runs(tmp_path) + _canvas_runs(tmp_path_factory)
    got, _ = _torchrun({"world": 2, "runs": runs}, tmp_path)
    want = _one_process(runs)
    assert isinstance(got, list), got
    for run, g, w in zip(runs, got, want, strict=True):
        assert g == w, (Path(run["model"]).name, run["kwargs"])


@pytest.mark.multigpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tp2_on_two_gpus_decodes_the_tokens_of_one_gpu(tmp_path: Path, tmp_path_factory):
    """NCCL, fp32, mode auto (round_graph under TP: collectives captured in the round graphs);
    the one-GPU reference runs round_graph too."""
    runs = _block_runs(tmp_path) + _canvas_runs(tmp_path_factory)
    job = {"world": 2, "runs": runs, "device": "cuda", "mode": "auto"}
    got, _ = _torchrun(job, tmp_path, timeout=600, peer_s=300)
    want = _one_process(runs, "cuda", "round_graph")
    assert isinstance(got, list), got
    for run, g, w in zip(runs, got, want, strict=True):
        assert g == w, (Path(run["model"]).name, run["kwargs"])


def test_a_rank_that_dies_ends_the_job_with_an_error_on_rank_0(tmp_path: Path):
    model = write_checkpoint(tmp_path / "qwen")
    runs = [{"model": str(model), "prompt": PROMPT, "kwargs": dict(max_new_tokens=8)}]
    got, elapsed = _torchrun({"world": 2, "runs": runs, "exit_rank": 1}, tmp_path, timeout=120)
    assert "another rank died" in got["error"], got
    assert "rank 0 of 2" in got["error"]
    assert elapsed < 90


def test_torchrun_generate_prints_once_the_one_process_text(tmp_path: Path):
    model = write_checkpoint(tmp_path / "qwen", residual=residual_config())
    args = ["generate", "--model", str(model), "--max-new-tokens", "16", "--ignore-eos"]
    args += ["--tp", "2", "Hello"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
    proc = subprocess.run(
        cmd + ["-m", "dlmrt", *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    want = LLM(model).generate("Hello", max_new_tokens=16, ignore_eos=True).text
    assert proc.stdout == want + "\n"  # rank 0 prints; the other rank only decodes


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    import urllib.request

    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _wait_healthy(url: str, proc: subprocess.Popen, deadline: float) -> None:
    import urllib.request

    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-4000:]
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("the server did not come up")


def test_torchrun_serve_rank_0_serves_the_one_process_text(tmp_path: Path):
    model = write_checkpoint(tmp_path / "qwen", residual=residual_config())
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
    cmd += ["-m", "dlmrt", "serve", "--model", str(model), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, time.monotonic() + 180)
        llm = LLM(model)
        for prompt in ("Hello", "Two"):  # the followers decode one request after another
            body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
            got = _post(url + "/v1/completions", body)["choices"][0]["text"]
            assert got == llm.generate(prompt, max_new_tokens=16, ignore_eos=True).text
    finally:
        proc.send_signal(2)  # SIGINT to torchrun: forwarded to both ranks
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
