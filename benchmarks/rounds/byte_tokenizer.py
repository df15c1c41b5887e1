"""ByteTokenizer: a byte-level BPE tokenizer built in memory at a model's vocabulary size, so that
llguidance can compile grammars over a random-weight model (`structured_round.py`); no download.

Ids 0..255 are the 256 bytes (GPT-2's byte-to-unicode alphabet, as a byte-level BPE stores them);
then filler tokens of 2 to 6 printable ASCII characters (seeded: the same vocabulary every run), so
the grammar's mask is computed over a vocabulary as large as a real one and a constraint such as
`[a-z ]+` allows only a small share of it; then the stop token `<|endoftext|>` and the mask token
at the model's `mask_token_id`. Ids above the mask token are the model's padding rows (as Qwen's
151936 embeddings over its 151669 tokens): outside the tokenizer, never allowed by a grammar.
There are no merges, so `encode` yields byte tokens; the fillers are reached only by decoding.
"""

from __future__ import annotations

import json
import random

from tokenizers import Tokenizer as HFTokenizer

FILLER_CHARS = [chr(c) for c in range(32, 127)]  # printable ASCII, the space included
STOP = "<|endoftext|>"
MASK = "<|MASK|>"


def _byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable character a byte-level BPE stores for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _fillers(count: int, seed: int) -> list[str]:
    """`count` distinct strings of 2 to 6 printable ASCII characters (seeded)."""
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < count:
        s = "".join(rng.choice(FILLER_CHARS) for _ in range(rng.randint(2, 6)))
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def tokenizer_json(mask_token_id: int, seed: int = 0) -> str:
    """The tokenizer.json text: bytes, fillers up to the stop token at mask_token_id - 1, the mask
    token at mask_token_id."""
    if mask_token_id < 258:
        raise ValueError(
            f"mask_token_id: expected at least 258 (256 bytes + stop), got {mask_token_id}"
        )
    alphabet = _byte_alphabet()
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    stop_id = mask_token_id - 1
    for s in _fillers(stop_id - 256, seed):
        vocab["".join(alphabet[b] for b in s.encode())] = len(vocab)

    def special(content: str, i: int) -> dict:
        return {"id": i, "content": content, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": True}  # fmt: skip

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}  # fmt: skip
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab, "merges": []}  # fmt: skip
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(STOP, stop_id), special(MASK, mask_token_id)],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
        "decoder": byte_level, "model": model,
    })  # fmt: skip


class ByteTokenizer:
    """The tokenizer an `LLM` around a random model needs for structured output: `to_json` (what
    `grammars_for` wraps), one stop id, the mask id, text decoding."""

    chat_template = None

    def __init__(self, mask_token_id: int, seed: int = 0) -> None:
        self._json = tokenizer_json(mask_token_id, seed)
        self._tok = HFTokenizer.from_str(self._json)
        self.mask_token_id = mask_token_id
        self.stop_id = mask_token_id - 1
        self.declared_stop_ids: frozenset[int] = frozenset({self.stop_id})
        self.stop_ids = self.declared_stop_ids

    def to_json(self) -> str:
        return self._json

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
