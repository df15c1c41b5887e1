"""What drafts cost: tokens/s of one QwenDLM-4B request (random bf16 weights) in each mode, plain
(folded and unfolded) and with drafts (`DraftBuilder` fed by the device-side round trace, so the
request runs unfolded), and whether the drafts' tokens equal the unfolded plain request's.

    python -m benchmarks.rounds.drafts_overhead [--rounds 23] [--new-tokens 1024] [--out benchmarks/results/drafts_overhead.json]

The schedule is forced with `fixed_steps` (random weights accept ~1 token per round), as in
`e2e_tps.py`. One warm-up request per configuration (graph capture) runs first.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import command_line, random_model, request_parser, wall_time, write_result
from dlmrt.decoding import make_rule
from dlmrt.drafts import DraftBuilder
from dlmrt.engine import BlockEngine
from dlmrt.model_shapes import qwen_dlm_4b

CASES = (("plain", True), ("plain", False), ("drafts", False))  # (what, fold_commits)


def _args() -> argparse.Namespace:
    return request_parser(__doc__, "benchmarks/results/drafts_overhead.json").parse_args()


def _measure(model, mode: str, what: str, fold: bool, prompt: list[int], rule, new_tokens: int):
    """(result row, token ids, drafts) of one warmed-up request."""
    engine = BlockEngine(model, torch.device("cuda"), torch.bfloat16, mode, fold)
    drafts: list = []

    def request():
        drafts.clear()
        hooks = {}
        if what == "drafts":
            builder = DraftBuilder(drafts.append)
            hooks = {"recorder": builder.record, "on_progress": builder.on_progress}
        return engine.generate(
            prompt, rule=rule, block_length=256, max_new_tokens=new_tokens, mask_id=151669,
            stop_ids=set(), ignore_eos=True, **hooks,
        )  # fmt: skip

    request()  # warm-up: graph capture, cuBLAS handles
    out: list = []
    wall = wall_time(lambda: out.append(request()))
    res = out[0]
    tps = len(res.token_ids) / wall
    print(f"{mode:>12} {what:>6} fold {fold!s:>5} {tps:>9.1f} tokens/s ({wall:.3f} s)", flush=True)
    row = {
        "mode": mode,
        "what": what,
        "fold_commits": fold,
        "tokens": len(res.token_ids),
        "wall_s": round(wall, 4),
        "tokens_per_s": round(tps, 1),
        "drafts": len(drafts),
    }
    return row, res.token_ids, [(d.block, d.round, d.tokens, d.states) for d in drafts]


def main() -> None:
    args = _args()
    model = random_model(qwen_dlm_4b(), torch.device("cuda"))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 150000, (args.prompt_tokens,), generator=gen).tolist()
    rule = make_rule("fixed_steps", denoising_steps=args.rounds)
    rows, same_tokens, drafts_by_mode = [], {}, {}
    for mode in args.modes:
        found = {}
        for what, fold in CASES:
            row, tokens, drafts = _measure(model, mode, what, fold, prompt, rule, args.new_tokens)
            rows.append(row)
            found[what, fold] = tokens
            if what == "drafts":
                drafts_by_mode[mode] = drafts
            torch.cuda.empty_cache()
        same_tokens[mode] = found["drafts", False] == found["plain", False]
    ref = drafts_by_mode[args.modes[0]]
    same_drafts = {m: d == ref for m, d in drafts_by_mode.items()}
    print("drafts' tokens == unfolded plain tokens:", same_tokens)
    print(f"drafts equal {args.modes[0]}'s:", same_drafts)
    payload = {
        "benchmark": "drafts_overhead",
        "command": command_line(),
        "rounds_per_block": args.rounds,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "drafts_tokens_equal_unfolded_plain": same_tokens,
        "drafts_equal_across_modes": same_drafts,
        "results": rows,
    }
    write_result(args.out, payload, args.git_revision)


if __name__ == "__main__":
    main()
