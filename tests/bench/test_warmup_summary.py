"""benchmarks/orl/warmup_summary.py: issue 39's gate per residual warm-up and the one ORL starts
from, on files as `residual_pipeline.sh warmup` leaves them."""

from __future__ import annotations

import json
from pathlib import Path

from benchmark_modules import benchmark


def _warmup(out: Path, tag: str, lr: float, ratio: float, on: tuple, off: tuple) -> None:
    (out / f"warm-{tag}.config.json").write_text(
        json.dumps({"adapter_lr": lr, "adapter_adam_eps": 1e-15, "steps": 400})
    )
    line = {"step": 399, "ce2": 0.2, "ce2_without_z": 0.21, "residual_ratio": ratio}
    (out / f"warm-{tag}.log.jsonl").write_text(json.dumps(line) + "\n")
    for name, (acc, tpf) in (("on", on), ("off", off)):
        result = {"accuracy": acc, "tokens_per_forward": tpf}
        (out / f"warm-{tag}-{name}.json").write_text(json.dumps(result))


def test_the_gate_needs_the_ratio_band_and_a_costly_ablation(tmp_path: Path):
    summary = benchmark("orl.warmup_summary")
    _warmup(tmp_path, "1e-4", 1e-4, 0.5, (0.80, 4.0), (0.79, 4.1))  # ablation costs 1 point only
    _warmup(tmp_path, "3e-4", 3e-4, 2.0, (0.85, 5.0), (0.70, 4.0))  # ratio out of the band
    _warmup(tmp_path, "2e-4", 2e-4, 0.8, (0.84, 5.0), (0.84, 4.4))  # passes: +13.6% TPF
    rows = {t: summary.summarize(tmp_path, t) for t in ("1e-4", "3e-4", "2e-4")}
    assert [rows[t]["passes_gate"] for t in ("1e-4", "3e-4", "2e-4")] == [False, False, True]
    assert rows["3e-4"]["ablation_cost_points"] == 15.0
    assert summary.choose(list(rows.values()))["tag"] == "2e-4"
    # none passing: the ratio nearest the paper's 0.91 in log space (|ln 0.5/0.91| = 0.60 < 0.79)
    assert summary.choose([rows["1e-4"], rows["3e-4"]])["tag"] == "1e-4"
