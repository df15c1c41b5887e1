"""Which tokens each denoising round accepts: where a model's rounds (and its TPF) go.

    python -m benchmarks.orl.round_profile --model DIR [--task arithmetic_chain] [--problems 60]
        [--threshold 0.9] [--device cpu] [--out results/round_profile.json]

Greedy `LLM.generate` on the first held-out problems of a task (chat or raw by seed, as in
training), with a recorder (`dlmrt/outputs.py: RoundRecord`): per request every round's accepted
rows and the tokens they took (`canvas_after`). Reports the histogram of rounds per block and,
per round index, how many accepted tokens were digits, words or other (spaces, punctuation,
special tokens). On the ORL demo's chain Base (docs/orl-demo.md) the first round takes most
tokens and later rounds are almost only digits: the results of the chained operations.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict

from dlmrt import LLM
from dlmrt.tasks import get_task
from dlmrt.train.data import is_chat, prompt_text


def kind(text: str) -> str:
    s = text.strip()
    if s.isdigit():
        return "digit"
    return "word" if s.isalpha() else "other"


def profile(llm: LLM, task: str, problems: int, threshold: float, max_new_tokens: int) -> dict:
    """{"rounds_per_block": {n: blocks}, "accepted": {round: {kind: tokens}}}."""
    blocks: Counter = Counter()
    accepted: dict[int, Counter] = defaultdict(Counter)
    tok = llm.tokenizer
    for p in get_task(task).problems("test", problems):
        records = []
        prompt = prompt_text(tok, p.question, is_chat(p.seed, 0.5))
        llm.generate(
            prompt,
            max_new_tokens=max_new_tokens,
            rule="threshold",
            threshold=threshold,
            recorder=records.append,
        )
        blocks.update(Counter(Counter(r.block_index for r in records).values()))
        for r in records:
            for i in r.accepted.nonzero().flatten().tolist():
                accepted[r.round][kind(tok.decode([int(r.canvas_after[i])]))] += 1
    return {
        "rounds_per_block": {str(n): blocks[n] for n in sorted(blocks)},
        "accepted": {str(k): dict(accepted[k]) for k in sorted(accepted)},
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="model directory")
    ap.add_argument("--task", default="arithmetic_chain", help="task with held-out problems")
    ap.add_argument("--problems", type=int, default=60)
    ap.add_argument("--threshold", type=float, default=0.9, help="the threshold rule's tau")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    llm = LLM(args.model, device=args.device)
    result = {
        "model": args.model,
        "task": args.task,
        "problems": args.problems,
        "threshold": args.threshold,
    }
    result |= profile(llm, args.task, args.problems, args.threshold, args.max_new_tokens)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
