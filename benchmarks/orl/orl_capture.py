"""ORL capture overhead: rollout tokens/s with the trainer's recorder vs without (QwenDLM-4B shape).

    python -m benchmarks.orl.orl_capture [--mode block_graph] [--rounds 12] [--new-tokens 1024]
        [--out benchmarks/results/orl_capture.json]

One request of `--new-tokens` tokens, `fixed_steps` forcing `--rounds` rounds per 256-token block
(random weights accept ~1 token per round otherwise), sampled at temperature 1. Without a
recorder the request runs in `--mode`; with `StateCapture` (dlmrt/train/orl/capture.py, what
`train_orl` passes) it runs in whatever mode the engine gives a recorder (until the device-side
trace lands: eager, unfolded). The target (issue 16): with capture >= 0.9x without.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import random_model, wall_time, write_result
from dlmrt.decoding import make_rule
from dlmrt.engine import BlockEngine
from dlmrt.model_shapes import qwen_dlm_4b
from dlmrt.train.orl.capture import StateCapture


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mode", default="block_graph")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/orl_capture.json")
    ap.add_argument("--git-revision", default=None)
    return ap.parse_args()


def _tps(engine, prompt, rule, args, capture: bool) -> dict:
    def request():
        rec = StateCapture(10**7) if capture else None
        res = engine.generate(
            prompt, rule=rule, block_length=256, max_new_tokens=args.new_tokens, mask_id=151669,
            stop_ids=set(), ignore_eos=True, temperature=1.0, seed=1, recorder=rec,
        )  # fmt: skip
        return res, (rec.count if rec else 0)

    request()  # warm-up: graph capture, cuBLAS handles
    best, out = None, []
    for _ in range(args.repeats):
        t = wall_time(lambda: out.append(request()))
        best = t if best is None else min(best, t)
    res, states = out[-1]
    return {
        "mode": res.mode,
        "seconds": best,
        "tokens_per_s": len(res.token_ids) / best,
        "denoising_forwards": res.denoising_forwards,
        "commit_forwards": res.commit_forwards,
        "captured_states": states,
        "tokens": res.token_ids,
    }


def main() -> None:
    args = _args()
    device = torch.device("cuda")
    model = random_model(qwen_dlm_4b(), device)
    engine = BlockEngine(model, device, torch.bfloat16, args.mode, True)
    rule = make_rule("fixed_steps", denoising_steps=args.rounds)
    prompt = list(range(1000, 1000 + args.prompt_tokens))
    plain = _tps(engine, prompt, rule, args, capture=False)
    captured = _tps(engine, prompt, rule, args, capture=True)
    same = plain.pop("tokens") == captured.pop("tokens")
    ratio = captured["tokens_per_s"] / plain["tokens_per_s"]
    print(
        f"without capture {plain['tokens_per_s']:.1f} tok/s ({plain['mode']}), with "
        f"{captured['tokens_per_s']:.1f} tok/s ({captured['mode']}): {ratio:.3f}x; "
        f"identical tokens: {same}"
    )
    write_result(
        args.out,
        {
            "benchmark": "orl_capture",
            "config": vars(args),
            "without_capture": plain,
            "with_capture": captured,
            "ratio": ratio,
            "target_ratio": 0.9,
            "identical_tokens": same,
        },
        args.git_revision,
    )


if __name__ == "__main__":
    main()
