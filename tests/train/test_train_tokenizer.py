"""The task tokenizer: specials, exact round trip, digits split, saved files dlmrt (and HF) read."""

from __future__ import annotations

import json

import pytest

from dlmrt.tasks import arithmetic
from dlmrt.tokenizer import Tokenizer
from dlmrt.train.tokenizer import SPECIALS, save_tokenizer, task_corpus, train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(task_corpus(arithmetic, 1000), 512)


def test_specials_vocab_and_determinism(tok):
    assert [tok.token_to_id(s) for s in SPECIALS] == [0, 1, 2, 3]
    assert 300 < tok.get_vocab_size() <= 512
    again = train_tokenizer(task_corpus(arithmetic, 1000), 512)
    assert again.to_str() == tok.to_str()


def test_round_trip_and_digits(tok):
    for p in arithmetic.problems("test", 50):
        for text in (p.question, " " + p.solution):
            ids = tok.encode(text).ids
            assert tok.decode(ids) == text
    pieces = tok.encode("He buys 315 more.").tokens
    assert ["3", "1", "5"] == [t for t in pieces if t.isdigit()]  # one token per digit
    assert "Ġbuys" in pieces  # task words are whole tokens
    odd = "Ünïcode ✓ 12+30?"
    assert tok.decode(tok.encode(odd).ids) == odd  # byte fallback: any text round-trips


def test_saved_files_load_in_dlmrt(tok, tmp_path):
    save_tokenizer(tok, tmp_path, 1024)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["mask_token"] == "<|MASK|>" and cfg["eos_token"] == "<|im_end|>"
    t = Tokenizer(tmp_path, config={})
    assert t.mask_token_id == 3
    prompt = t.apply_chat_template([{"role": "user", "content": "What is 1 + 2?"}])
    assert prompt == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    ids = t.encode(prompt)
    assert ids[0] == 1 and ids.count(2) == 1  # specials recognised in text
    assert t.decode(ids) == "user\nWhat is 1 + 2?\nassistant\n"


def test_saved_files_load_in_transformers(tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    save_tokenizer(tok, tmp_path, 1024)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.mask_token_id == 3 and hf.eos_token_id == 2 and hf.pad_token_id == 0
    text = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"
    assert hf("Tom has 23 apples.")["input_ids"] == tok.encode("Tom has 23 apples.").ids


def test_training_prompts_match_what_generate_feeds_the_model(tok, tmp_path):
    from dlmrt.train.data import Formatter, prompt_text

    save_tokenizer(tok, tmp_path, 1024)
    t = Tokenizer(tmp_path, config={})
    fmt = Formatter(t, 16)
    for p in arithmetic.problems("test", 20):
        for chat in (True, False):
            ex = fmt.encode(p.question, p.solution, chat)
            assert ex.prompt == t.encode(prompt_text(t, p.question, chat))  # as LLM.generate
            assert (len(ex.prompt) + len(ex.response)) % 16 == 0
            stop = 2 if chat else 0
            end = ex.response.index(stop)
            assert set(ex.response[end + 1 :]) <= {0}  # padded with <|endoftext|>
            assert arithmetic.verify(t.decode(ex.response[:end]), p.answer)
