"""A small byte-level BPE tokenizer trained with `tokenizers` on a task's text.

Pre-tokenisation is Qwen2's: single digits (numbers are spelled digit by digit, so arithmetic
sees every digit), words with their leading space, punctuation runs, whitespace; then byte-level
BPE over the full 256-byte alphabet, so any text encodes and decodes exactly (an unseen word
falls back to smaller pieces). Special tokens <|endoftext|>, <|im_start|>, <|im_end|>, <|MASK|>
get ids 0-3. Saved the standard way: `tokenizer.json` plus a `tokenizer_config.json` with the
ChatML chat template, eos/pad/mask tokens and `added_tokens_decoder` (transformers'
`AutoTokenizer` loads it as a `PreTrainedTokenizerFast`; dlmrt's `Tokenizer` reads the same files).
Training is deterministic: same texts and vocab size, same tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
# ChatML, as Qwen and SDAR checkpoints spell it.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ENDOFTEXT, IM_START, IM_END, MASK = SPECIALS
# Qwen2's pre-tokenizer pattern (digits one by one).
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def empty_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE with at most `vocab_size` tokens (fewer if the texts run out of merges)."""
    if vocab_size < 256 + len(SPECIALS):
        raise ValueError(f"vocab_size: must be >= {256 + len(SPECIALS)}, got {vocab_size}")
    tok = empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    for i, name in enumerate(SPECIALS):
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name))
    return tok


def task_corpus(task: ModuleType, count: int) -> list[str]:
    """Tokenizer training text: the questions and solutions of the first `count` train problems."""
    texts = ["user\n", "assistant\n"]
    for problem in task.problems("train", count):
        texts += [problem.question, " " + problem.solution]
    return texts


def tokenizer_config(max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "mask_token": MASK,
        "unk_token": None,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {
                "content": name,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, name in enumerate(SPECIALS)
        },
    }


def save_tokenizer(tok: Tokenizer, out: Path, max_length: int) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(max_length), indent=2))
