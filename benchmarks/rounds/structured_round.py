"""ms per round with and without a grammar constraint, at a full model shape (random weights).

    python -m benchmarks.rounds.structured_round [--model qwen_dlm|llada2|diffusion_gemma]
        [--device cuda|cpu]
        [--tiny] [--format regex|json] [--iters N] [--out FILE]

The model is the family's full-size config (`dlmrt/model_shapes.py`; `--tiny`: the ttft
benchmark's tiny widths) with seeded random weights (`ttft_models.build`), in an `LLM` whose
tokenizer is a byte-level BPE padded to the model's vocabulary (`byte_tokenizer.py`), so
llguidance compiles grammars over it. Every request: the same random prompt of `--context` tokens
(its K/V reused after the first request: no prefill is timed), `--new-tokens` new tokens, greedy,
ignore_eos, the fixed_steps rule forced to the ttft benchmark's rounds per block. Runs:

  block_graph            unconstrained, one graph per block (the default mode)
  round_graph            unconstrained, one graph replay per round (the same mode as below)
  round_graph + grammar  the format below: each round decided through the grammar on the host
                         (`dlmrt/engine/block/structured.py`; structured requests always run
                         round by round, the commit unfolded)

DiffusionGemma (rounds are denoising steps): block_graph and eager unconstrained, then the
format on its eager step loop (`dlmrt/engine/encoder_decoder/structured.py`).

Formats, both binding every row (a random model picks among the allowed tokens only):
regex `[a-z ]+` (the budget ends it), json `{"text": <string of [a-z ]>}` (the random model may
close the string early: the rows after the document are stop fill, decided with no round, so the
run has fewer rounds; `tokens` counts them, `ignore_eos`). On the CPU every run is eager. ms per round = the median request time / its rounds (denoising forwards) (commit passes and host
work included); grammar ms per round = the grammar's host time / rounds.
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
from pathlib import Path

import torch

from benchmarks.common import command_line, wall_time, write_result
from benchmarks.rounds.byte_tokenizer import ByteTokenizer
from benchmarks.rounds.ttft_models import MODELS, NO_FILES, Bench, build
from dlmrt import LLM
from dlmrt.params import DecodeParams
from dlmrt.styles import Hooks

TEXT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "pattern": "^[a-z ]+$"}},
    "required": ["text"],
    "additionalProperties": False,
}
FORMATS = {
    "regex": ({"type": "regex", "regex": "[a-z ]+"}, re.compile(r"[a-z ]+")),
    "json": (
        {"type": "json_schema", "json_schema": {"schema": TEXT_SCHEMA}},
        re.compile(r'\{"text":"[a-z ]+"\}'),
    ),
}


def runs(device: torch.device, model: str) -> list[tuple[str, bool]]:
    """(mode, constrained) of each run: graph modes on CUDA, eager on the CPU. DiffusionGemma's
    structured requests run its eager step loop, so its comparison is block_graph and eager
    unconstrained against the constrained run (in an engine built block_graph)."""
    if device.type != "cuda":
        return [("eager", False), ("eager", True)]
    if model == "diffusion_gemma":
        return [("block_graph", False), ("eager", False), ("block_graph", True)]
    return [("block_graph", False), ("round_graph", False), ("round_graph", True)]


def valid(text: str, fmt: str) -> bool:
    """The output up to its stop token matches the format (the regex's whole-text check)."""
    return FORMATS[fmt][1].fullmatch(text) is not None


def time_run(bench: Bench, tok: ByteTokenizer, mode: str, fmt: str | None, args) -> dict:
    """One run: a warm-up request (graphs captured, the prompt's K/V kept), then `args.iters`
    timed requests. Its result row."""
    llm = LLM.from_model(bench.model, tok, path=NO_FILES, mode=mode, prefix_reuse=True)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, tok.stop_id, (args.context,), generator=gen).tolist()
    kw = bench.request(args.new_tokens)
    params = DecodeParams(**kw, response_format=FORMATS[fmt][0] if fmt else None)
    out = []

    def request() -> None:
        out.append(llm.style.generate(prompt, params, Hooks()))

    request()  # warm-up: captures, and keeps the prompt's K/V for the timed requests
    seconds = [wall_time(request) for _ in range(args.iters)]
    res = out[-1]
    # DiffusionGemma's structured requests run the eager step loop with its own cache: each
    # encodes its prompt (counted in the row: `prompt_encoded`); every other run reuses it
    if res.prefill_forwards and not (fmt and bench.name == "diffusion_gemma"):
        raise RuntimeError(f"{mode}: a timed request prefilled (expected its prompt reused)")
    rounds = sum(res.rounds_per_block)
    ms = statistics.median(seconds) * 1e3
    row = {"mode": res.mode, "format": fmt or "none", "engine_mode": llm.mode}
    row |= {"ms_per_request": round(ms, 3), "ms_per_round": round(ms / max(rounds, 1), 3)}
    row |= {"grammar_ms_per_round": round(res.grammar_ms / max(rounds, 1), 3)}
    row |= {"rounds": rounds, "denoising_forwards": res.denoising_forwards}
    row |= {"commit_forwards": res.commit_forwards, "tokens": len(res.token_ids)}
    row |= {"forced_tokens": res.forced_tokens, "prompt_encoded": bool(res.prefill_forwards)}
    # bf16: the warm-up's cold prefill may round apart from the reused K/V (docs/prefix-reuse.md)
    row["same_tokens_every_request"] = all(r.token_ids == res.token_ids for r in out)
    if fmt:
        ids = res.token_ids
        text = tok.decode(ids[: ids.index(tok.stop_id)] if tok.stop_id in ids else ids)
        row |= {"valid": valid(text, fmt), "text_head": text[:40]}
    return row


def table(rows: list[dict]) -> str:
    """The printed markdown table."""
    head = "| run | ms / round | grammar ms / round | rounds | forwards | tokens | forced | valid |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["mode"] + (f" + {r['format']}" if r["format"] != "none" else "")
        lines.append(
            f"| {name} | {r['ms_per_round']:.3f} | {r['grammar_ms_per_round']:.3f} | "
            f"{r['rounds']} | {r['denoising_forwards']} | {r['tokens']} | "
            f"{r['forced_tokens']} | {r.get('valid', '-')} |"
        )
    return "\n".join(lines)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", choices=MODELS, default="qwen_dlm")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny widths (a CPU smoke test)")
    ap.add_argument("--layers", type=int, default=None, help="default: the model's own")
    ap.add_argument("--format", choices=sorted(FORMATS), default="regex")
    ap.add_argument("--iters", type=int, default=3, help="timed requests per run")
    ap.add_argument("--context", type=int, default=None, help="prompt tokens (default 512; tiny 8)")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 256; tiny 16")
    ap.add_argument(
        "--out", default=None, help="default benchmarks/results/structured_round_<model>.json"
    )
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args(argv)
    args.context = args.context or (8 if args.tiny else 512)
    args.new_tokens = args.new_tokens or (16 if args.tiny else 256)
    if args.iters < 1:
        ap.error(f"--iters: expected at least 1, got {args.iters}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu, with --tiny for seconds)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    device = torch.device(args.device)
    bench = build(args.model, device, args.tiny, args.layers)
    cfg = bench.model.cfg  # DiffusionGemma has no mask token: its last id stands in (unused)
    tok = ByteTokenizer(getattr(cfg, "mask_token_id", None) or cfg.vocab_size - 1)
    rows = []
    for mode, constrained in runs(device, args.model):
        rows.append(time_run(bench, tok, mode, args.format if constrained else None, args))
        gc.collect()  # the run's engine (arena, graphs) goes before the next one builds its own
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(rows[-1], flush=True)
    print(table(rows))
    shape = bench.shape() | {"dtype": str(next(bench.model.parameters()).dtype)}
    payload = {
        "benchmark": "structured_round",
        "model": args.model,
        "tiny": args.tiny,
        "command": command_line(),
        "shape": shape,
        "format": args.format,
        "response_format": FORMATS[args.format][0],
        "context": args.context,
        "new_tokens": args.new_tokens,
        "iters": args.iters,
        "results": rows,
    }
    out = args.out or f"benchmarks/results/structured_round_{args.model}.json"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_result(out, payload, args.git_revision)
    return payload


if __name__ == "__main__":
    main()
