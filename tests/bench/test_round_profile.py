"""`benchmarks/orl/round_profile.py`: every accepted token is counted once, in its round."""

from __future__ import annotations

from benchmark_modules import benchmark

from dlmrt import LLM
from dlmrt.tasks import get_task
from dlmrt.train.data import is_chat, prompt_text


def test_profile_counts_each_blocks_unresolved_rows_once():
    rp = benchmark("orl.round_profile")
    assert (rp.kind(" 42"), rp.kind("the"), rp.kind("."), rp.kind(" ")) == (
        "digit",
        "word",
        "other",
        "other",
    )
    llm = LLM(device="cpu")
    got = rp.profile(llm, "arithmetic", 3, 0.9, 48)
    unresolved, blocks = 0, 0
    for p in get_task("arithmetic").problems("test", 3):  # the same requests, recorded directly
        records = []
        prompt = prompt_text(llm.tokenizer, p.question, is_chat(p.seed, 0.5))
        llm.generate(
            prompt, max_new_tokens=48, rule="threshold", threshold=0.9, recorder=records.append
        )
        first = [r for r in records if r.round == 0]
        unresolved += sum(int(r.unresolved.sum()) for r in first)
        blocks += len(first)
    assert sum(n for rounds in got["accepted"].values() for n in rounds.values()) == unresolved
    assert sum(got["rounds_per_block"].values()) == blocks
    assert set().union(*got["accepted"].values()) <= {"digit", "word", "other"}
