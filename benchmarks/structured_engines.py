"""Compare the grammar engines dlmrt could use for structured output: llguidance and xgrammar.

For each schema of `SCHEMAS` and each engine: does it compile (coverage), how long compiling takes,
and the mean time to compute one token mask along a seeded random walk through the grammar (a
random allowed token each step, the stop token once the document may end). Run on the CPU:

    python -m benchmarks.structured_engines [--tokenizer DIR] [--out results.json]

DIR holds a tokenizer.json (default: the embedded demo model's). Both engines must be installed
(`pip install llguidance xgrammar`); docs/structured-output.md reports the result.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMAS: dict[str, dict] = {
    "answer_int": {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "point": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "tags", "point"],
        "additionalProperties": False,
    },
    "pattern_and_bounds": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
            "n": {"type": "integer", "minimum": 1, "maximum": 99},
            "items": {"type": "array", "items": {"type": "boolean"}, "minItems": 1},
        },
        "required": ["id", "n", "items"],
    },
    "anyof_ref": {
        "$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer"}}}},
        "anyOf": [{"$ref": "#/$defs/leaf"}, {"type": "array", "items": {"$ref": "#/$defs/leaf"}}],
    },
    "recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    },
    "format_date_time": {
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date-time"}},
        "required": ["when"],
    },
}


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer_json: str, vocab: int, eos: int) -> None:
        import llguidance

        self.ll = llguidance
        self.tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos)
        self.vocab = vocab

    def compile(self, schema: dict):
        compact = {"whitespace_flexible": False}
        grammar = self.ll.LLMatcher.grammar_from_json_schema(json.dumps(schema), compact)
        failed, messages = self.ll.LLMatcher.validate_grammar_with_warnings(grammar, self.tok)
        if failed:
            raise ValueError(messages[0])
        return self.ll.LLMatcher(self.tok, grammar)

    def mask(self, m) -> np.ndarray:
        words = np.full((self.vocab + 31) // 32, -1, dtype=np.int32)
        m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        return words

    def accept(self, m, token: int) -> None:
        if not m.consume_token(token):
            raise RuntimeError(m.get_error())


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer_json: str, vocab: int, eos: int) -> None:
        import tempfile

        import xgrammar
        from transformers import PreTrainedTokenizerFast

        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            f.write(tokenizer_json)
            f.flush()
            hf = PreTrainedTokenizerFast(tokenizer_file=f.name)
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.vocab = vocab

    def compile(self, schema: dict):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, m) -> np.ndarray:
        bitmask = self.xgr.allocate_token_bitmask(1, self.vocab)
        m.fill_next_token_bitmask(bitmask)
        return bitmask.numpy()[0]

    def accept(self, m, token: int) -> None:
        if not m.accept_token(token):
            raise RuntimeError(f"token {token} refused")


def _allowed(words: np.ndarray, vocab: int) -> list[int]:
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits).tolist()


def walk(engine, matcher, eos: int, steps: int, seed: int) -> list[float]:
    """Mask times (ms) along a seeded random walk; stops at the stop token."""
    rng, times = random.Random(seed), []
    for _ in range(steps):
        t0 = time.perf_counter()
        words = engine.mask(matcher)
        times.append((time.perf_counter() - t0) * 1e3)
        allowed = _allowed(words, engine.vocab)
        if not allowed:
            break
        token = eos if eos in allowed and rng.random() < 0.3 else rng.choice(allowed)
        engine.accept(matcher, token)
        if token == eos:
            break
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "dlmrt" / "assets" / "demo"
    ap.add_argument("--tokenizer", default=str(default))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tokenizer_json = (Path(args.tokenizer) / "tokenizer.json").read_text()
    vocab = len(json.loads(tokenizer_json)["model"]["vocab"])
    eos = 0
    rows = []
    for cls in (LLGuidance, XGrammar):
        t0 = time.perf_counter()
        engine = cls(tokenizer_json, vocab, eos)
        setup_ms = (time.perf_counter() - t0) * 1e3
        for name, schema in SCHEMAS.items():
            row = {"engine": cls.name, "schema": name, "tokenizer_setup_ms": round(setup_ms, 1)}
            try:
                t0 = time.perf_counter()
                matcher = engine.compile(schema)
                row["compile_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
                times = walk(engine, matcher, eos, 200, seed=0)
                row["mask_ms_mean"] = round(statistics.mean(times), 4)
                row["mask_ms_max"] = round(max(times), 4)
                row["compiled"] = True
            except Exception as e:  # coverage: record what the engine refuses, and why
                row["compiled"], row["error"] = False, f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps({"vocab": vocab, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
