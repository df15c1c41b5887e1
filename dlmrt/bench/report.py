"""Report: per-request records -> the metrics of the paper's Appendix E.1, a table and the JSON.

- accuracy = correct / n; a length-terminated answer (finish_reason "length") counts as wrong.
- clean requests: those that ended with a stop token. Only they enter the efficiency statistics.
- completion TPF of a request = generated tokens / denoising forwards; `clean_tpf` is its mean over
  clean requests, `clean_tpf_pooled` = sum of tokens / sum of denoising forwards over them.
- clean tokens/s = sum of tokens / sum of request times over clean requests, pooled, without the
  run's first request (the warm-up, reported separately). Request time is `request_time_s` of
  `LLM.generate`: tokenisation, prefill, decoding and host overhead, not model loading.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA = "dlmrt.bench/v1"


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one run (one sweep point); `records` in request order, warm-up first."""
    n = len(records)
    correct = sum(1 for r in records if r["correct"])
    clean = [r for r in records if r["clean"]]
    timed = [r for r in clean if not r["warmup"]]
    timed_all = [r for r in records if not r["warmup"]]
    return {
        "n": n,
        "correct": correct,
        "accuracy": correct / n if n else None,
        "n_clean": len(clean),
        "n_length_terminated": sum(1 for r in records if r["finish_reason"] == "length"),
        "clean_tpf": _mean([r["tokens_per_forward"] for r in clean]),
        "clean_tpf_pooled": _ratio(clean, "tokens", "denoising_forwards"),
        "clean_tokens_per_s": _ratio(timed, "tokens", "request_time_s"),
        "clean_timed_requests": len(timed),
        "clean_tokens": sum(r["tokens"] for r in timed),
        "clean_time_s": sum(r["request_time_s"] for r in timed),
        "all_tokens_per_s": _ratio(timed_all, "tokens", "request_time_s"),
        "mean_tokens": _mean([r["tokens"] for r in records]),
    }


def warmup_info(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    first = next((r for r in records if r["warmup"]), None)
    if first is None:
        return None
    keys = ("id", "finish_reason", "correct", "tokens", "request_time_s", "tokens_per_s")
    return {k: first[k] for k in keys}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(records: list[dict[str, Any]], num: str, den: str) -> float | None:
    d = sum(r[den] for r in records)
    return sum(r[num] for r in records) / d if d else None


def format_table(report: dict[str, Any]) -> str:
    """A fixed-width table, one row per run."""
    head = (
        "run",
        "accuracy",
        "correct/n",
        "clean",
        "len-term",
        "clean TPF",
        "pooled TPF",
        "clean tok/s",
        "warm-up s",
    )
    rows = [head]
    for run in report["runs"]:
        s, w = run["summary"], run["warmup"] or {}
        rows.append(
            (
                run["label"],
                _fmt(s["accuracy"], 100, "%", digits=1),
                f"{s['correct']}/{s['n']}",
                str(s["n_clean"]),
                str(s["n_length_terminated"]),
                _fmt(s["clean_tpf"]),
                _fmt(s["clean_tpf_pooled"]),
                _fmt(s["clean_tokens_per_s"], digits=1),
                _fmt(w.get("request_time_s"), digits=3),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in enumerate(zip(r, widths)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * wd for wd in widths))
    title = (
        f"{report['dataset']} ({report['kind']}, {report['n_problems']} problems, "
        f"scorer {report['scorer']}) on {report['model']}"
    )
    return title + "\n" + "\n".join(lines)


def _fmt(value: float | None, scale: float = 1.0, suffix: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{suffix}"


def write_json(report: dict[str, Any], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
