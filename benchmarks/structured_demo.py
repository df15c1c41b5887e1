"""Structured output on the demo model: validity, accuracy, TPF and grammar host time per round.

Three runs over the first N held-out arithmetic problems (greedy, the default threshold rule):
unconstrained; the whole-format regex (each step `<int> <op> <int> = <int>.`, then `The answer is
<int>.`); and the JSON schema {"answer": <integer>}. TPF counts the tokens the grammar forced as
decoded (tokens / denoising forwards). CPU by default:

    python -m benchmarks.structured_demo [--problems N] [--device cpu] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

from dlmrt import LLM
from dlmrt.params import DecodeParams
from dlmrt.styles import Hooks
from dlmrt.tasks.arithmetic import problems, verify

REGEX = r" (-?\d+ [-+*/] -?\d+ = -?\d+\. )*The answer is -?\d+\."
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
FORMATS = {
    "unconstrained": None,
    "regex": {"type": "regex", "regex": REGEX},
    "json_answer": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
}


def _check(name: str, text: str, answer: int) -> tuple[bool, bool]:
    """(valid, correct) of one output under format `name`."""
    if name == "json_answer":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            return False, False
        valid = isinstance(doc, dict) and set(doc) == {"answer"} and type(doc["answer"]) is int
        return valid, valid and doc["answer"] == answer
    valid = re.fullmatch(REGEX, text) is not None
    return valid, verify(text, answer)


def run(llm: LLM, name: str, fmt, probs, max_new_tokens: int) -> dict:
    valid = correct = tokens = forwards = rounds = forced = 0
    grammar_ms = 0.0
    t0 = time.perf_counter()
    for p in probs:
        ids = llm.tokenizer.encode(p.question)
        params = DecodeParams(max_new_tokens=max_new_tokens, response_format=fmt)
        res = llm.style.generate(ids, params, Hooks())
        text = llm.tokenizer.decode(res.token_ids)
        ok, right = _check(name, text, p.answer)
        valid, correct = valid + ok, correct + right
        tokens += len(res.token_ids)
        forwards += res.denoising_forwards
        rounds += sum(res.rounds_per_block)
        forced += res.forced_tokens
        grammar_ms += res.grammar_ms
    n = len(probs)
    return {
        "format": name,
        "problems": n,
        "valid": valid / n,
        "accuracy": correct / n,
        "tpf": tokens / max(forwards, 1),
        "forced_token_share": forced / max(tokens, 1),
        "grammar_host_ms_per_round": grammar_ms / max(rounds, 1),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    llm = LLM(device=args.device)
    probs = problems("test", args.problems)
    rows = [run(llm, name, fmt, probs, args.max_new_tokens) for name, fmt in FORMATS.items()]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        meta = {"device": args.device, "torch": torch.__version__, "mode": llm.mode}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
