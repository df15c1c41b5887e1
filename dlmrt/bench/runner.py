"""Runner: the `dlmrt bench` subcommand — generate for every problem, score, summarize, report.

One run per sweep value (`--sweep KNOB=v1,v2,...` over a `DecodeParams` field; without it, one run
with the given flags). Prompts are rendered before the clock starts (preprocessing is excluded);
each run's first request is its warm-up (scored, but excluded from tokens/s).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import sys
from typing import Any

from dlmrt.bench import MissingDependency
from dlmrt.bench.checks import check_bench_args
from dlmrt.bench.datasets import Problem, load_problems, pick_template, render_prompt
from dlmrt.bench.report import SCHEMA, format_table, summarize, warmup_info, write_json
from dlmrt.params import DecodeParams
from dlmrt.rules import BLOCK, RULE_OF_KNOB, RULES

log = logging.getLogger("dlmrt")
# A block rule's knob swept without --rule selects the rule that declares it (dlmrt/rules.py).
SWEEP_RULE = {knob: info.name for knob, info in RULE_OF_KNOB.items() if info.style == BLOCK}


def bench_command(args: Any) -> int:
    """The `dlmrt bench` subcommand (arguments from `dlmrt.cli`)."""
    try:
        return _bench(args)
    except MissingDependency as e:
        print(f"dlmrt: error: {e}", file=sys.stderr)
        return 1


def _bench(args: Any) -> int:
    from dlmrt.config import EngineConfig
    from dlmrt.flags import values

    check_bench_args(args)  # output paths, --timeout, --prompt-template: before the run
    if args.plot:
        from dlmrt.bench.plot import require_matplotlib

        require_matplotlib()  # fail before the (long) run, not after it
    base = DecodeParams(**values(args, DecodeParams))
    points = sweep_points(args.sweep, base)
    problems = load_problems(args.dataset, args.limit, args.shuffle, args.seed or 0)
    if base.ignore_eos:
        log.warning("--ignore-eos: every answer is length-terminated, so every answer is wrong")

    from dlmrt.distributed.requests import root_only
    from dlmrt.llm import LLM

    llm = LLM(**values(args, EngineConfig))
    # torchrun: rank 0 runs the benchmark (scoring, tables, files), the other ranks follow
    return root_only(llm, lambda: _run(args, llm, problems, points))


def _run(args: Any, llm: Any, problems: list, points: list) -> int:
    chat = not args.no_chat
    template = pick_template(args.prompt_template, llm.path, problems[0].kind, chat)
    print(f"dlmrt: prompt template ({template[1]}): {template[0]!r}", file=sys.stderr)
    prompts = [_render(p, llm, chat, template[0]) for p in problems]
    runs = []
    for label, value, params in points:
        label = label or _rule_label(params, llm)
        records = run_point(llm, problems, prompts, params, args.timeout, label, args.no_progress)
        runs.append(
            {
                "label": label,
                "knob_value": value,
                "params": dataclasses.asdict(params),
                "summary": summarize(records),
                "warmup": warmup_info(records),
                "requests": records,
            }
        )
    report = _report(args, llm, problems, chat, runs, template)
    print(format_table(report))
    if args.out:
        write_json(report, args.out)
        print(f"dlmrt: results written to {args.out}", file=sys.stderr)
    if args.plot:
        from dlmrt.bench.plot import plot_frontier

        plot_frontier(report, args.plot, getattr(args, "plot_x", "tps"))
        print(f"dlmrt: frontier plot written to {args.plot}", file=sys.stderr)
    return 0


def sweep_points(
    spec: str | None, base: DecodeParams
) -> list[tuple[str | None, Any, DecodeParams]]:
    """(label, knob value, params) per run. Sweeping a rule's knob selects that rule if --rule
    was not given (sweeping `threshold` under the entropy-budget rule would change nothing)."""
    if not spec:
        return [(None, None, base)]
    knob, sep, raw = spec.partition("=")
    knob = knob.strip().replace("-", "_")
    fields = {f.name: f for f in dataclasses.fields(DecodeParams)}
    if not sep or knob not in fields or not raw.strip():
        raise ValueError(
            f"sweep: expected KNOB=v1,v2,... with KNOB one of {', '.join(fields)}, got {spec!r}"
        )
    parse = _value_parser(str(fields[knob].type), knob)
    overrides: dict[str, Any] = {}
    if knob in SWEEP_RULE and base.rule is None:
        overrides["rule"] = SWEEP_RULE[knob]
    points = []
    for text in raw.split(","):
        value = parse(text.strip())
        params = dataclasses.replace(base, **{**overrides, knob: value})  # validates the value
        points.append((f"{knob}={value}", value, params))
    return points


def _value_parser(annotation: str, knob: str):
    def parse(text: str) -> Any:
        try:
            if annotation.startswith("bool"):
                return {"true": True, "false": False, "1": True, "0": False}[text.lower()]
            if annotation.startswith("int"):
                return int(text)
            if annotation.startswith("float"):
                return float(text)
        except (KeyError, ValueError):
            raise ValueError(f"sweep: {knob}: cannot parse {text!r} as {annotation}") from None
        return text

    return parse


def _rule_label(params: DecodeParams, llm: Any) -> str:
    decoder = llm.decoder_of(params)  # the request's knobs, else the checkpoint's, else dlmrt's
    rule = decoder["rule"]
    if rule in ("threshold", "entropy_budget"):  # the rule's one knob, named as the rule
        return f"{rule}={decoder[rule]}"
    if RULES[rule].style == BLOCK:
        return f"{rule} steps={params.denoising_steps or 'B'}"
    return rule  # the canvas decoder: its settings are the checkpoint's unless swept


def _render(problem: Problem, llm: Any, chat: bool, template: str | None) -> str:
    try:
        return render_prompt(problem, llm.tokenizer, chat, template)
    except ValueError as e:
        raise ValueError(f"{e} (pass --no-chat to send the raw prompt)") from None


def run_point(
    llm: Any,
    problems: list[Problem],
    prompts: list[str],
    params: DecodeParams,
    timeout_s: float,
    label: str = "",
    quiet: bool = False,
) -> list[dict[str, Any]]:
    """Generate and score every problem once with `params`; the first request is the warm-up."""
    from tqdm.auto import tqdm

    records: list[dict[str, Any]] = []
    with tqdm(total=len(problems), desc=label or "bench", unit="req", disable=quiet) as bar:
        for i, (problem, prompt) in enumerate(zip(problems, prompts)):
            out = llm.generate(prompt, params=params)
            status, correct = score(problem, out.text, out.finish_reason, timeout_s)
            records.append(_record(i, problem, out, status, correct))
            bar.update(1)
            acc = sum(r["correct"] for r in records) / len(records)
            bar.set_postfix(acc=f"{acc:.0%}", tpf=f"{out.tokens_per_forward:.2f}", refresh=False)
    return records


def score(problem: Problem, text: str, finish_reason: str, timeout_s: float) -> tuple[str, bool]:
    """(status, correct). A length-terminated answer is wrong without being scored."""
    if finish_reason == "length":
        return "length", False
    if problem.kind == "math":
        from dlmrt.bench.scorers import score_math

        ok = score_math(text, problem.answer or "")
        return ("correct" if ok else "wrong"), ok
    from dlmrt.bench.humaneval_runner import check_completion

    res = check_completion(
        problem.text, text, problem.test or "", problem.entry_point or "", timeout_s
    )
    return res.status, res.passed


def _record(i: int, problem: Problem, out: Any, status: str, correct: bool) -> dict[str, Any]:
    return {
        "index": i,
        "id": problem.id,
        "warmup": i == 0,
        "finish_reason": out.finish_reason,
        "clean": out.finish_reason == "stop",
        "status": status,
        "correct": correct,
        "prompt_tokens": out.prompt_tokens,
        "tokens": out.num_generated_tokens,
        "denoising_forwards": out.num_denoising_forwards,
        "tokens_per_forward": out.tokens_per_forward,
        "request_time_s": out.request_time_s,
        "tokens_per_s": out.request_tps,
        "completion": out.text,
    }


def _report(
    args: Any, llm: Any, problems: list[Problem], chat: bool, runs: list, template: tuple[str, str]
) -> dict:
    from dlmrt import __version__
    from dlmrt.bench.scorers import scorer_name

    kind = problems[0].kind
    knob = args.sweep.partition("=")[0].strip().replace("-", "_") if args.sweep else None
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "dlmrt_version": __version__,
        "model": str(llm.path),
        "device": str(llm.device),
        "dtype": str(llm.dtype).removeprefix("torch."),
        "mode": llm.mode,
        "quantization": llm.config.quantization,  # None: as the checkpoint is stored
        "kv_cache_dtype": llm.config.kv_cache_dtype,
        "default_rule": llm.default_rule,
        "decoder": llm.decoder_of(),  # what a request gets for the knobs it leaves unset
        "dataset": args.dataset,
        "kind": kind,
        "n_problems": len(problems),
        "limit": args.limit,
        "shuffle": args.shuffle,
        "chat": chat,
        "prompt_template": template[0],
        "prompt_template_source": template[1],  # --prompt-template | checkpoint (...) | default
        "scorer": "humaneval-exec" if kind == "code" else scorer_name(),
        "timeout_s": args.timeout if kind == "code" else None,
        "sweep": {"knob": knob, "values": [r["knob_value"] for r in runs]} if knob else None,
        "runs": runs,
    }
