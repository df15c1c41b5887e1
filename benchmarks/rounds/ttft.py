"""Time to first token in a 3-turn conversation, prefix reuse on vs off (issue 54).

    python -m benchmarks.rounds.ttft --model qwen_dlm|llada2|diffusion_gemma
        [--contexts 1024,4096,16384] [--device cuda|cpu] [--tiny] [--stream on|off] [--out FILE]
    python -m benchmarks.rounds.ttft --model qwen_dlm --tiny --device cpu    # a smoke test

The family's full-size shape with random weights (`dlmrt/model_shapes.py`; `--tiny`: tiny widths)
in block_graph mode (the CPU: eager), behind `LLM` (`ttft_models.py`). Per context C, one
conversation: turn 1's prompt is C random token ids; each later turn's prompt is the previous
prompt + its answer + `--user-tokens` new random ids, so an engine with prefix reuse serves the
previous request's committed blocks from its arena. Every request generates `--max-new-tokens`
tokens (ignore_eos) in a forced number of rounds per block (`ttft_models.ROUNDS`), so every run
does the same work. Two `LLM`s over the one model: cold (prefix_reuse=False) and reused (True).
Per turn: `ttft_ms`, the host time from `generate` to the first `on_tokens` call (the first
final tokens a streaming client sees: every round with `--stream on`, docs/streaming.md); `prefill_ms`, the prefill's device time
(CUDA events, the engine's `prefill_timer`, `dlmrt/engine/prefill_timer.py`) and `prefill_rows`,
the rows it ran; `request_ms`, the whole request; `cached_tokens`; `ms_per_round`, (request -
prefill) / denoising forwards: an upper bound on a round (the host clock's request minus the
prefill's device time leaves the prefill's host launches in the rounds; the round time proper is
`benchmarks/rounds/round_latency.py`'s); `lag_ms_median` / `lag_ms_max`, the time from the round that
made rows final (its publish, on the device's clock) to their `on_tokens` call
(`dlmrt/engine/block/stream_lag.py`; CUDA with streaming only). Each is the median of `--repeats` conversations (fresh random ids,
the engine's prefix cleared first), after `--warmups` conversations of the same lengths (graphs
captured, the arena at its final size). `--stream on|off` passes `stream_rounds` to `LLM`
(tokens every round, also out of the block graph, or once per block); the round time with
streaming on vs off comes from one run of each.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from benchmarks.common import command_line, write_result
from benchmarks.rounds.ttft_models import MODELS, build, make_llm, stream_option
from dlmrt.engine.block import stream_lag
from dlmrt.engine.prefill_timer import PrefillTimer

TURNS = 3
MODULE = "python -m benchmarks.rounds.ttft"  # a result's command when `main` gets its arguments
TIMES = ("ttft_ms", "prefill_ms", "request_ms", "ms_per_round")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(llm, prompt: list[int], request: dict) -> dict:
    """One request: its times, prefill rows, cached tokens and answer."""
    first: list[float] = []

    def on_tokens(tokens: list[int]) -> None:  # the request's final tokens, as they grow
        if tokens and not first:
            first.append(time.perf_counter())

    timer = llm.engine.prefill_timer
    timer.take()  # nothing from before this request
    stream_lag.start(llm.device)  # CUDA: the clock offset calibrated before the clock starts
    _sync(llm.device)
    t0 = time.perf_counter()
    try:
        out = llm.generate(prompt, on_tokens=on_tokens, **request)
        _sync(llm.device)
    finally:
        lag = stream_lag.stop().summary()
    end = time.perf_counter()
    rows, prefill_ms = timer.take()
    if not first:
        raise RuntimeError("the request streamed no token (on_tokens was never called)")
    request_ms = (end - t0) * 1e3
    forwards = max(out.num_denoising_forwards, 1)
    return {
        "prompt_tokens": len(prompt),
        "cached_tokens": out.num_cached_tokens,
        "prefill_rows": rows,
        "ttft_ms": (first[0] - t0) * 1e3,
        "prefill_ms": prefill_ms,
        "request_ms": request_ms,
        "ms_per_round": (request_ms - prefill_ms) / forwards,
        "denoising_forwards": out.num_denoising_forwards,
        "answer": out.token_ids,
    } | lag


def conversation(llm, context: int, args, seed: int, vocab: int) -> list[dict]:
    """`TURNS` requests, each prompt the previous one + its answer + new user tokens."""
    gen = torch.Generator().manual_seed(seed)
    top = min(vocab, args.id_limit)

    def ids(n: int) -> list[int]:
        return torch.randint(0, top, (n,), generator=gen).tolist()

    llm.engine.prefix.clear()  # a new conversation: nothing of the last one is reused
    prompt, turns = ids(context), []
    for turn in range(TURNS):
        if turn:
            prompt = prompt + turns[-1]["answer"] + ids(args.user_tokens)
        turns.append(measure(llm, prompt, args.request))
    return turns


def run_context(llms: dict, context: int, args, vocab: int) -> list[dict]:
    """Warm-ups, then `--repeats` conversations per engine (cold and reused alternating); one
    row per (engine, turn) with the median times."""
    for k in range(args.warmups):  # the first may grow the arena (dropping its graphs)
        for llm in llms.values():
            conversation(llm, context, args, 10_000 + k, vocab)
    runs: dict[str, list[list[dict]]] = {name: [] for name in llms}
    for r in range(args.repeats):
        for name, llm in llms.items():
            runs[name].append(conversation(llm, context, args, r, vocab))
    rows = []
    for name, convs in runs.items():
        for turn in range(TURNS):
            samples = [c[turn] for c in convs]
            row = {"context": context, "prefix_reuse": name == "reused", "turn": turn + 1}
            keep = ("prompt_tokens", "cached_tokens", "prefill_rows", "denoising_forwards")
            row |= {k: samples[0][k] for k in keep}
            row |= {k: round(statistics.median(s[k] for s in samples), 3) for k in TIMES}
            row |= _lag(samples)
            same = runs["cold"][0][turn]["answer"] == convs[0][turn]["answer"]
            rows.append(row | {"same_tokens_as_cold": same, "stream": args.stream_status})
    return rows


def _lag(samples: list[dict]) -> dict:
    """The stream's lag over the samples (`stream_lag.py`): the median of each request's median
    and the largest of their maxima (None: nothing measured, e.g. the CPU or --stream off)."""
    meds = [s["lag_ms_median"] for s in samples if s["lag_ms_median"] is not None]
    maxes = [s["lag_ms_max"] for s in samples if s["lag_ms_max"] is not None]
    return {
        "lag_ms_median": round(statistics.median(meds), 4) if meds else None,
        "lag_ms_max": max(maxes) if maxes else None,
    }


def markdown(rows: list[dict], title: str) -> str:
    """The rows as a markdown table: per context and turn, cold / reused side by side."""
    head = (
        f"{title}\n\n| context | turn | prompt | cached | TTFT ms (cold / reused) | "
        "prefill ms | request ms | ms/round | lag ms (reused: median / max) |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    pairs: dict[tuple[int, int], dict[bool, dict]] = {}
    for r in rows:
        pairs.setdefault((r["context"], r["turn"]), {})[r["prefix_reuse"]] = r
    lines = [head]
    for (context, turn), pair in sorted(pairs.items()):
        cold, reused = pair[False], pair[True]
        cells = [f"{cold[k]:.1f} / {reused[k]:.1f}" for k in TIMES]
        med, top = reused["lag_ms_median"], reused["lag_ms_max"]
        cells.append("-" if med is None else f"{med:.2f} / {top:.2f}")
        lines.append(
            f"| {context} | {turn} | {reused['prompt_tokens']} | {reused['cached_tokens']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def _contexts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token counts, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive token counts, got {text!r}")
    return values


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", choices=MODELS, default="qwen_dlm")
    ap.add_argument("--contexts", type=_contexts, default=None,
                    help="turn 1's prompt tokens (default: 1024,4096,16384; --tiny: 32,64)")  # fmt: skip
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny widths (a CPU smoke test)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers at full widths")
    ap.add_argument("--mode", default=None, help="default: block_graph (CUDA), eager (CPU)")
    ap.add_argument("--stream", choices=["on", "off"], default="on")
    ap.add_argument("--rounds", type=int, default=None, help="forced rounds a block (canvas)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--user-tokens", type=int, default=128, help="new tokens each later turn")
    ap.add_argument("--repeats", type=int, default=3, help="timed conversations (median)")
    ap.add_argument("--warmups", type=int, default=2, help="untimed conversations first")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/ttft_<model>.json")
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args(argv)
    for name in ("max_new_tokens", "user_tokens", "repeats", "rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected at least 1")
    if args.warmups < 0:
        ap.error("--warmups: expected at least 0")
    if args.tiny and args.layers is not None:
        ap.error("--layers: a full-width option, not with --tiny")
    args.contexts = args.contexts or ([32, 64] if args.tiny else [1024, 4096, 16384])
    args.mode = args.mode or ("block_graph" if args.device.startswith("cuda") else "eager")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    device = torch.device(args.device)
    bench = build(args.model, device, args.tiny, args.layers)
    if args.rounds is not None:
        bench = dataclasses.replace(bench, rounds=args.rounds)
    stream_kwargs, args.stream_status = stream_option(args.stream)
    args.request = bench.request(args.max_new_tokens)
    # random prompt ids below the mask id (a prompt row holding it would read as a mask) and
    # 150000 (the other round benchmarks' prompts)
    args.id_limit = min(getattr(bench.model.cfg, "mask_token_id", None) or bench.vocab, 150000)
    llms = {}
    for name, reuse in (("cold", False), ("reused", True)):
        llms[name] = make_llm(bench, args.mode, reuse, stream_kwargs)
        llms[name].engine.prefill_timer = PrefillTimer()
    rows = []
    with torch.inference_mode():
        for context in args.contexts:
            rows += run_context(llms, context, args, bench.vocab)
    mode = llms["cold"].mode
    title = (
        f"{args.model}{' (tiny)' if args.tiny else ''}, {mode}, stream {args.stream_status}, "
        f"{args.max_new_tokens} new tokens, {device.type}"
    )
    print(markdown(rows, title))
    result = {"benchmark": "ttft", "model": args.model, "tiny": args.tiny, "mode": mode,
              "stream": args.stream_status, "max_new_tokens": args.max_new_tokens,
              "user_tokens": args.user_tokens, "repeats": args.repeats, "shape": bench.shape(),
              "command": command_line() if argv is None else " ".join([MODULE, *argv]),
              "rows": rows}  # fmt: skip
    write_result(
        args.out or f"benchmarks/results/ttft_{args.model}.json", result, args.git_revision
    )
    return result


if __name__ == "__main__":
    main()
