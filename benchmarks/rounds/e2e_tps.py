"""End-to-end tokens/s of one request, QwenDLM-4B shape, random bf16 weights, in each mode.

    python -m benchmarks.rounds.e2e_tps [--rounds 23] [--new-tokens 1024] [--quantization fp8]
        [--out benchmarks/results/e2e_tps.json]

Random weights accept ~1 token per round, so the block schedule is forced with `fixed_steps`
(23 rounds per 256-token block ~ the paper's 11 tokens per forward on HumanEval). Request time
covers prefill, every block's rounds and commit pass, and the host loop (not graph capture: one
warm-up request runs first). Each mode runs with commit folding on and off (`--fold`).
--quantization fp8: the model's FP8 candidates quantized and installed as the loader does
(`fp8_model.quantize`: FP8 GEMMs where they measure faster at the block rows).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import fp8_model
from benchmarks.common import command_line, random_model, request_parser, wall_time, write_result
from dlmrt.decoding import make_rule
from dlmrt.engine import BlockEngine
from dlmrt.model_shapes import qwen_dlm_4b


def _args() -> argparse.Namespace:
    ap = request_parser(__doc__, "benchmarks/results/e2e_tps.json")
    ap.add_argument("--fold", nargs="+", choices=["on", "off"], default=["on", "off"])
    ap.add_argument("--quantization", choices=["none", "fp8"], default="none")
    return ap.parse_args()


def _measure(model, mode: str, fold: str, prompt: list[int], rule, new_tokens: int):
    """(result row, token ids) of one warmed-up request in `mode` with folding `fold`."""
    engine = BlockEngine(model, torch.device("cuda"), torch.bfloat16, mode, fold == "on")

    def request():
        return engine.generate(
            prompt, rule=rule, block_length=256, max_new_tokens=new_tokens, mask_id=151669,
            stop_ids=set(), ignore_eos=True,
        )  # fmt: skip

    request()  # warm-up: graph capture, cuBLAS handles
    out: list = []
    wall = wall_time(lambda: out.append(request()))
    res = out[0]
    n, tps = len(res.token_ids), len(res.token_ids) / wall
    print(
        f"{mode:>12} fold {fold:>3} {tps:>9.1f} tokens/s  ({res.denoising_forwards} denoising "
        f"+ {res.commit_forwards} commit forwards, {wall:.3f} s)",
        flush=True,
    )
    row = {
        "mode": mode,
        "fold_commits": fold == "on",
        "tokens": n,
        "wall_s": round(wall, 4),
        "tokens_per_s": round(tps, 1),
        "denoising_forwards": res.denoising_forwards,
        "commit_forwards": res.commit_forwards,
        "tokens_per_forward": round(n / res.denoising_forwards, 2),
        "tokens_per_forward_all": round(n / (res.denoising_forwards + res.commit_forwards), 2),
    }
    return row, res.token_ids


def main() -> None:
    args = _args()
    cfg = qwen_dlm_4b()
    model = random_model(cfg, torch.device("cuda"))
    if args.quantization == "fp8":
        fp8_model.quantize(model)
    prompt = torch.randint(
        0, 150000, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    rule = make_rule("fixed_steps", denoising_steps=args.rounds)
    rows, tokens = [], {}
    for mode, fold in [(m, f) for m in args.modes for f in args.fold]:
        row, tokens[mode, fold] = _measure(model, mode, fold, prompt, rule, args.new_tokens)
        rows.append(row)
        torch.cuda.empty_cache()
    base = next(
        (r["tokens_per_s"] for r in rows if r["mode"] == "eager" and not r["fold_commits"]), None
    )
    for r in rows:
        r["speedup_vs_eager"] = round(r["tokens_per_s"] / base, 2) if base else None
    # Per fold setting: the three modes run the same kernels (identical tokens expected). Folded
    # vs unfolded runs multiply 2B- vs B-row GEMMs, which cuBLAS may round differently in bf16.
    same = {f: len({tuple(t) for (m, g), t in tokens.items() if g == f}) == 1 for f in args.fold}
    print("tokens identical across modes (per fold setting):", same)
    agree = None
    if len(args.fold) == 2:
        on, off = tokens[args.modes[0], "on"], tokens[args.modes[0], "off"]
        agree = round(sum(a == b for a, b in zip(on, off, strict=True)) / len(on), 4)
        print(f"fold on vs off: {agree:.1%} of tokens agree")
    write_result(
        args.out,
        {
            "benchmark": "e2e_tps",
            "command": command_line(),
            "rounds_per_block": args.rounds,
            "weights": "fp8" if args.quantization == "fp8" else "bf16",
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "tokens_identical_across_modes": same,
            "fold_on_off_token_agreement": agree,
            "results": rows,
        },
        args.git_revision,
    )


if __name__ == "__main__":
    main()
