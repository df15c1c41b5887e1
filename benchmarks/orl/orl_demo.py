"""The ORL demo's measurement (issue 17): accuracy, tokens per forward and tokens/s of several
models over one decoder sweep, on the same held-out problems.

    python -m benchmarks.orl.orl_demo --model base=runs/chain-base --model orl=runs/chain-orl \
        --task arithmetic_chain --problems 500 --out benchmarks/results/orl_demo_h200.json

Every model decodes every point of the grid: the `entropy_budget` rule at each gamma and the
`threshold` rule at each tau (greedy, `--max-new-tokens` at most, the block length of the
checkpoint). The problems are the first N of the task's test split, each asked raw or through the
chat template by its seed, as in training (`dlmrt/train/evaluate.py`). tokens/s is generated tokens
over the wall time of the point's requests (one request at a time, after one warm-up request per
model). The frontier plot: `benchmarks/orl/orl_demo_plot.py`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import write_result
from dlmrt import LLM
from dlmrt.tasks import TASKS, get_task
from dlmrt.train.evaluate import evaluate

GAMMAS = (0.2, 0.4, 0.8, 1.5, 3.0)
TAUS = (0.5, 0.7, 0.9)


def grid(gammas: list[float], taus: list[float]) -> list[dict]:
    """The decoder points: entropy_budget at each gamma, then threshold at each tau."""
    return [{"rule": "entropy_budget", "entropy_budget": g} for g in gammas] + [
        {"rule": "threshold", "threshold": t} for t in taus
    ]


def sweep(llm: LLM, task, problems: int, points: list[dict], max_new_tokens: int) -> list[dict]:
    """One evaluation per point (the same problems each time), with tokens/s."""
    first = task.problems("test", 1)[0]
    llm.generate(first.question, max_new_tokens=max_new_tokens)  # warm-up: graphs, kernels
    rows = []
    for point in points:
        res = evaluate(llm, task, problems, max_new_tokens=max_new_tokens, **point)
        res["tokens_per_s"] = round(res["generated_tokens"] / max(res["seconds"], 1e-9), 1)
        rows.append(res)
        print(
            f"  {point}: accuracy {res['accuracy']:.3f}  TPF {res['tokens_per_forward']:.2f}  "
            f"{res['tokens_per_s']:.0f} tok/s",
            flush=True,
        )
    return rows


def _models(specs: list[str]) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--model: expected NAME=DIR, got {spec!r}")
        if not Path(path).is_dir():
            raise SystemExit(f"--model {spec}: {path} is not a directory")
        out.append((name, path))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", action="append", required=True, help="NAME=DIR (repeatable)")
    ap.add_argument("--task", default="arithmetic_chain", choices=sorted(TASKS))
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--gammas", type=float, nargs="*", default=list(GAMMAS))
    ap.add_argument("--taus", type=float, nargs="*", default=list(TAUS))
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--mode", default="auto", help="execution mode (auto: block_graph on CUDA)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args()
    task, points = get_task(args.task), grid(args.gammas, args.taus)
    results = {}
    for name, path in _models(args.model):
        print(f"{name}: {path}", flush=True)
        llm = LLM(path, device=args.device, dtype=args.dtype, mode=args.mode)
        results[name] = {
            "path": path,
            "mode": llm.mode,
            "points": sweep(llm, task, args.problems, points, args.max_new_tokens),
        }
        del llm
    payload = {
        "task": args.task,
        "problems": args.problems,
        "max_new_tokens": args.max_new_tokens,
        "dtype": args.dtype or ("bfloat16" if args.device != "cpu" else "float32"),
        "models": results,
    }
    write_result(args.out, payload, args.git_revision)


if __name__ == "__main__":
    main()
