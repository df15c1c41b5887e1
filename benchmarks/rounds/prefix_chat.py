"""Prefix reuse in a multi-turn chat with a checkpoint's own chat template: per turn, the prompt's
tokens, how many an earlier request's K/V served (`num_cached_tokens`), and the request time,
reuse on vs off (two engines, the same turns).

    python -m benchmarks.rounds.prefix_chat [--model DIR] [--device cpu] [--turns 3] [--out FILE]

The client's side is a plain chat loop: each turn's prompt is the checkpoint's template rendered
over the whole conversation so far, the previous answers sent back as the text the engine
decoded (re-tokenized, as an OpenAI client does). Default: the embedded demo model and a short
arithmetic conversation.
"""

from __future__ import annotations

import argparse

from benchmarks.common import command_line, write_result
from dlmrt import LLM

QUESTIONS = (
    "Tom has 23 apples. He buys 15 more. How many apples now?",
    "He gives away 9 of them. How many are left?",
    "Then his sister doubles what he has. How many apples does he have?",
    "He eats 4. How many are left?",
)


def conversation(llm: LLM, turns: int, max_new_tokens: int) -> list[dict]:
    """One chat of `turns` user messages; per turn the prompt length, cached tokens, time."""
    messages, rows = [], []
    for question in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": question})
        text = llm.tokenizer.apply_chat_template(messages)
        ids = llm.tokenizer.encode(text)
        out = llm.generate(ids, max_new_tokens=max_new_tokens)
        messages.append({"role": "assistant", "content": out.text})
        rows.append(
            {
                "prompt_tokens": len(ids),
                "cached_tokens": out.num_cached_tokens,
                "request_ms": round(out.request_time_s * 1e3, 2),
                "answer": out.text,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None, help="a checkpoint directory (default: the demo)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--turns", type=int, default=3, choices=range(1, len(QUESTIONS) + 1))
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    result = {"benchmark": "prefix_chat", "model": args.model or "demo"}
    for reuse in (True, False):
        llm = LLM(args.model, device=args.device, prefix_reuse=reuse)
        turns = conversation(llm, args.turns, args.max_new_tokens)
        result["reuse" if reuse else "cold"] = turns
        for i, t in enumerate(turns):
            print(
                f"reuse={reuse} turn {i + 1}: {t['cached_tokens']}/{t['prompt_tokens']} cached, "
                f"{t['request_ms']} ms"
            )
    same = [a["answer"] == b["answer"] for a, b in zip(result["reuse"], result["cold"])]
    result["same_answers"] = same
    result["command"] = command_line()
    if args.out:
        write_result(args.out, result, None)
    return result


if __name__ == "__main__":
    main()
