"""`dlmrt train {sft, orl, eval, export}`: flags of `sft` and `orl` derive from the `TrainConfig`
and `ORLConfig` fields.

    dlmrt train sft --task arithmetic --out runs/demo [--device cuda] [--steps N] [--resume]
    dlmrt train orl --model DIR --task arithmetic --out runs/orl [--recipe FILE] [--resume]
    dlmrt train eval --model runs/demo --rule threshold --threshold 0.9 --problems 500
    dlmrt train eval --model runs/orl --task arithmetic --adapter off   # the residual ablation
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

from dlmrt.tasks import TASKS  # stdlib only: cheap at CLI start-up

CHOICES = {
    "task": tuple(TASKS),
    "loss_weighting": ("mean", "elbo"),
    "precision": ("auto", "bf16", "fp32"),
    "attention": ("auto", "flex", "dense"),
}


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    from dlmrt.flags import add_dataclass_flags
    from dlmrt.train.config import TrainConfig

    train = sub.add_parser("train", help="train a block-diffusion model (SFT or ORL on a task)")
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

    _add_orl_parser(tsub)
    _add_residual_parser(tsub)
    _add_eval_parser(tsub)

    ex = tsub.add_parser(
        "export",
        help="copy a run's model files (no optimizer state or logs) to a new directory",
    )
    ex.add_argument("src", help="run directory or checkpoint")
    ex.add_argument("dest", help="new model directory")
    ex.add_argument("--dtype", default="bfloat16", help="weights dtype (default: bfloat16)")
    ex.add_argument(
        "--rule",
        help="the model's default decoder rule (generation_config.json "
        "'dlmrt_decoder', docs/decoding.md); none of these: the source's entry, if any, is kept",
    )
    _decoder_flags(ex, lambda knob: f"its default `{knob.name}` (the rule's knob)")
    ex.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


def _add_orl_parser(tsub: argparse._SubParsersAction) -> None:
    from dlmrt.flags import add_dataclass_flags
    from dlmrt.train.orl.config import CHOICES as ORL_CHOICES
    from dlmrt.train.orl.config import ORLConfig
    from dlmrt.train.orl.tasks import NAMES

    orl = tsub.add_parser(
        "orl",
        help="on-policy residual learning (ORL) of a QwenDLM-format model on a verifiable task",
        description="ORL (docs/orl-training.md): rollouts with the current weights through "
        "dlmrt's engine, verified, replayed with their exact captured states (packed staircase "
        "attention), CE + AEC. OUT becomes an HF model directory (`LLM(OUT, role='orl')`) with "
        "orl_config.json, log.jsonl and checkpoints/. Under torchrun: data parallel.",
    )
    orl.add_argument("--out", default=None, help="run directory (or `out` in the recipe)")
    orl.add_argument("--recipe", default=None, help="TOML file of ORLConfig fields (and `out`)")
    orl.add_argument(
        "--resume", action="store_true", help="continue the run in OUT from its last checkpoint"
    )
    orl.add_argument("--no-progress", action="store_true", help="no progress bar")
    orl.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    choices = {**ORL_CHOICES, "task": NAMES}
    add_dataclass_flags(orl, ORLConfig, "ORL training (ORLConfig)", choices, keep_absent=True)


def _add_residual_parser(tsub: argparse._SubParsersAction) -> None:
    from dlmrt.flags import add_dataclass_flags
    from dlmrt.train.residual_config import WarmupConfig

    res = tsub.add_parser(
        "residual",
        help="offline residual warm-up: teach a model's ORL adapter to use the previous round",
        description="Offline residual warm-up (dlmrt/train/residual_warmup.py, docs/orl-training.md):"
        " per packed SFT row a plain pass, the n lowest-entropy masked rows of each block accepted,"
        " then a pass with z = softmax(logits) E at the rest; CE on both. OUT becomes an ORL"
        " checkpoint (`LLM(OUT, role='orl')`, the start of `dlmrt train orl`) with log.jsonl.",
    )
    res.add_argument("--out", required=True, help="output checkpoint directory")
    choices = {"task": CHOICES["task"]}
    add_dataclass_flags(res, WarmupConfig, "warm-up (WarmupConfig)", choices)


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
    _decoder_flags(ev, lambda k: f"{k.help} (default: the checkpoint's, else {k.fallback})")
    ev.add_argument("--max-new-tokens", type=int, default=128, help="per problem (default: 128)")
    ev.add_argument(
        "--adapter",
        choices=("on", "off"),
        default="on",
        help="off: the ORL residual adapter's output zeroed (g(z) = 0), the ablation that shows "
        "what the residual pathway buys; needs a model with an adapter (default: on)",
    )
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


def _decoder_flags(parser: argparse.ArgumentParser, help_of: Any) -> None:
    """A flag per block knob a checkpoint may default (declared in dlmrt/rules.py), its help
    `help_of(knob)`."""
    from dlmrt.rules import BLOCK, style_knobs

    for knob in style_knobs(BLOCK, checkpoint=True):
        flag = "--" + knob.name.replace("_", "-")
        parser.add_argument(flag, type=knob.type, help=help_of(knob))


def cmd_train(args: argparse.Namespace) -> int:
    if args.train_command == "sft":
        return _sft(args)
    if args.train_command == "orl":
        return _orl(args)
    if args.train_command == "eval":
        return _eval(args)
    if args.train_command == "residual":
        from dlmrt.flags import values
        from dlmrt.train.residual_config import WarmupConfig
        from dlmrt.train.residual_warmup import train

        print(
            json.dumps(
                {"out": str(train(WarmupConfig(**values(args, WarmupConfig)), Path(args.out)))}
            )
        )
        return 0
    from dlmrt.styles.decoder_defaults import KNOBS
    from dlmrt.train.export import export

    decoder = {k: getattr(args, k) for k in KNOBS if getattr(args, k) is not None}
    print(export(args.src, args.dest, args.dtype, decoder))
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


def _orl(args: argparse.Namespace) -> int:
    from dlmrt.train.orl.config import ORLConfig
    from dlmrt.train.orl.loop import train_orl
    from dlmrt.train.orl.recipe import load_recipe
    from dlmrt.train.orl.run_dir import saved_config

    given = load_recipe(args.recipe) if args.recipe else {}
    out = args.out or given.pop("out", None)
    given.pop("out", None)
    if out is None:
        raise ValueError("--out: required (or `out` in the recipe)")
    fields = dataclasses.fields(ORLConfig)
    given.update({f.name: getattr(args, f.name) for f in fields if hasattr(args, f.name)})
    saved = saved_config(Path(out)) if args.resume else None
    cfg = dataclasses.replace(saved, **given) if saved else ORLConfig(**given)
    res = train_orl(cfg, out, resume=args.resume, progress=not args.no_progress)
    summary: dict[str, Any] = {"out": str(res.out), "step": res.step}
    if res.entries:
        last = res.entries[-1]
        summary.update({k: last[k] for k in ("reward", "loss") if k in last})
    if res.interrupted:
        summary["interrupted"] = True
    print(json.dumps(summary))
    return 130 if res.interrupted else 0


def _eval(args: argparse.Namespace) -> int:
    from dlmrt.llm import LLM
    from dlmrt.params import DecodeParams
    from dlmrt.styles.decoder_defaults import KNOBS
    from dlmrt.tasks import get_task
    from dlmrt.train.evaluate import evaluate

    if args.out:
        check_out_file(Path(args.out))  # before the run, not after it
    llm = LLM(args.model, dtype=args.dtype, device=args.device, mode=args.mode)
    adapter = getattr(llm.model, "adapter", None)
    if args.adapter == "off":
        if adapter is None:
            raise ValueError(f"--adapter off: {args.model} has no ORL residual adapter")
        adapter.switch_off()
    params = {k: getattr(args, k) for k in KNOBS} | {"max_new_tokens": args.max_new_tokens}
    res = evaluate(
        llm,
        get_task(args.task),
        args.problems,
        args.chat_fraction,
        show_progress=sys.stderr.isatty(),
        **{k: v for k, v in params.items() if v is not None},
    )
    # the decoder run: the flags' knobs, else the checkpoint's, else dlmrt's
    decoder = llm.decoder_of(DecodeParams(**params))
    res = {"model": str(args.model), "rule": decoder["rule"], **res}
    if adapter is not None:
        res["adapter"] = args.adapter
    res.update({k: decoder[k] for k in KNOBS[1:] if k in decoder})  # the block style's
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
