"""`dlmrt train {sft, eval, export}`: flags of `sft` derive from the `TrainConfig` fields.

    dlmrt train sft --task arithmetic --out runs/demo [--device cuda] [--steps N] [--resume]
    dlmrt train eval --model runs/demo --rule threshold --threshold 0.9 --problems 500
    dlmrt train export runs/demo dlmrt-demo --dtype bfloat16

Only the flags given on the command line override: a resumed run keeps its train_config.json
values for everything else (and refuses changes that would alter the steps already taken).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

CHOICES = {
    "task": ("arithmetic",),
    "loss_weighting": ("mean", "elbo"),
    "precision": ("auto", "bf16", "fp32"),
    "attention": ("auto", "flex", "dense"),
}


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    from dlmrt.flags import add_dataclass_flags
    from dlmrt.train.config import TrainConfig

    train = sub.add_parser("train", help="train a block-diffusion model (SFT on a task)")
    tsub = train.add_subparsers(dest="train_command", required=True)

    sft = tsub.add_parser(
        "sft",
        help="block-diffusion SFT of a small QwenDLM-format model on a procedural task",
        description="Block-diffusion SFT (SDAR layout [prompt | clean | noisy]) of a QwenDLM-"
        "format model. OUT becomes an HF model directory (`dlmrt generate --model OUT`) with "
        "train_config.json, log.jsonl and checkpoints/.",
    )
    sft.add_argument("--out", required=True, help="run directory")
    sft.add_argument(
        "--resume", action="store_true", help="continue the run in OUT from its last checkpoint"
    )
    sft.add_argument("--no-progress", action="store_true", help="no progress bar")
    sft.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    # absent flags keep the config's (or, on --resume, the run's) value
    add_dataclass_flags(sft, TrainConfig, "training (TrainConfig)", CHOICES, keep_absent=True)

    _add_eval_parser(tsub)

    ex = tsub.add_parser(
        "export",
        help="copy a run's model files (no optimizer state or logs) to a new directory",
    )
    ex.add_argument("src", help="run directory or checkpoint")
    ex.add_argument("dest", help="new model directory")
    ex.add_argument("--dtype", default="bfloat16", help="weights dtype (default: bfloat16)")
    ex.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


def _add_eval_parser(tsub: argparse._SubParsersAction) -> None:
    ev = tsub.add_parser(
        "eval",
        help="accuracy and tokens per forward of a model on held-out task problems",
        description="Run `LLM.generate` on the first N held-out problems of a task (chat or raw "
        "prompt by seed, as in training) and check each answer; prints one JSON object.",
    )
    ev.add_argument("--model", required=True, help="model directory")
    ev.add_argument(
        "--task", default="arithmetic", choices=CHOICES["task"], help="task (default: arithmetic)"
    )
    ev.add_argument("--problems", type=int, default=200, help="held-out problems (default: 200)")
    ev.add_argument(
        "--chat-fraction",
        type=float,
        default=0.5,
        help="share of problems asked through the chat template (default: 0.5)",
    )
    ev.add_argument("--rule", default=None, help="acceptance rule (default: the checkpoint's)")
    ev.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="`threshold` rule: accept rows with confidence > tau (default: 0.9)",
    )
    ev.add_argument(
        "--entropy-budget",
        type=float,
        default=None,
        help="`entropy_budget` rule: gamma, in nats (default: 0.8)",
    )
    ev.add_argument("--max-new-tokens", type=int, default=128, help="per problem (default: 128)")
    ev.add_argument(
        "--device", default=None, help="cpu | cuda | cuda:N (default: cuda if available, else cpu)"
    )
    ev.add_argument(
        "--dtype",
        default=None,
        help="float32 | bfloat16 | float16 (default: bfloat16 on GPU, float32 on CPU)",
    )
    ev.add_argument(
        "--mode", default="auto", help="auto | block_graph | round_graph | eager (default: auto)"
    )
    ev.add_argument(
        "--out", default=None, help="also write the JSON result to this file (default: none)"
    )
    ev.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


def cmd_train(args: argparse.Namespace) -> int:
    if args.train_command == "sft":
        return _sft(args)
    if args.train_command == "eval":
        return _eval(args)
    from dlmrt.train.export import export

    print(export(args.src, args.dest, args.dtype))
    return 0


def _sft(args: argparse.Namespace) -> int:
    from dlmrt.train.config import TrainConfig
    from dlmrt.train.trainer import train_sft

    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if hasattr(args, f.name)
    }
    saved = Path(args.out) / "train_config.json"
    if args.resume and saved.is_file():
        cfg = dataclasses.replace(TrainConfig.load(saved), **given)
    else:
        cfg = TrainConfig(**given)
    res = train_sft(cfg, args.out, resume=args.resume, progress=not args.no_progress)
    summary: dict[str, Any] = {"out": str(res.out), "step": res.step}
    if res.evals:
        summary["eval"] = res.evals[-1]
    if res.interrupted:
        summary["interrupted"] = True
    print(json.dumps(summary))
    return 130 if res.interrupted else 0


def _eval(args: argparse.Namespace) -> int:
    from dlmrt.llm import LLM
    from dlmrt.train.evaluate import evaluate
    from dlmrt.train.tasks import get_task

    if args.out:
        check_out_file(Path(args.out))  # before the run, not after it
    llm = LLM(args.model, dtype=args.dtype, device=args.device, mode=args.mode)
    params = {
        "rule": args.rule,
        "threshold": args.threshold,
        "entropy_budget": args.entropy_budget,
        "max_new_tokens": args.max_new_tokens,
    }
    res = evaluate(
        llm,
        get_task(args.task),
        args.problems,
        args.chat_fraction,
        show_progress=sys.stderr.isatty(),
        **{k: v for k, v in params.items() if v is not None},
    )
    res = {"model": str(args.model), "rule": args.rule or llm.default_rule, **res}
    text = json.dumps(res)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


def check_out_file(path: Path) -> None:
    """A result file's path: not a directory, in a directory that exists."""
    if path.is_dir():
        raise ValueError(f"--out: {path} is a directory, not a file")
    if not path.parent.is_dir():
        raise ValueError(f"--out: {path}: directory {path.parent} does not exist")
