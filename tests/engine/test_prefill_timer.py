"""The engines' prefill timing hook (`dlmrt/engine/prefill_timer.py`): it records only when a timer
is set, counts the rows each prefill ran (reused rows are not prefilled), and reads back once."""

from __future__ import annotations

import contextlib

import torch

from dlmrt.engine.prefill_timer import PrefillTimer, prefill_span

CPU = torch.device("cpu")


def test_without_a_timer_the_hook_records_nothing():
    assert isinstance(prefill_span(None, 5, CPU), contextlib.nullcontext)


def test_take_sums_the_spans_since_the_last_take_and_forgets_them():
    timer = PrefillTimer()
    assert timer.take() == (0, 0.0)  # no prefill ran: a fully reused prompt
    with prefill_span(timer, 16, CPU):
        torch.ones(64, 64) @ torch.ones(64, 64)
    with prefill_span(timer, 8, CPU):
        pass
    rows, ms = timer.take()
    assert rows == 24 and ms > 0
    assert timer.take() == (0, 0.0)


def test_the_block_engine_times_only_the_rows_it_prefills():
    """A request whose prompt shares whole blocks with the last one's prefills only the rest."""
    from dataclasses import replace

    from benchmark_modules import benchmark

    models = benchmark("rounds.ttft_models")
    bench = models.build("qwen_dlm", CPU, tiny=True)
    llm = models.make_llm(bench, "eager", True, {})
    llm.engine.prefill_timer = timer = PrefillTimer()
    B = bench.model.cfg.block_size
    prompt = list(range(3, 3 + 4 * B + 3))  # 4 full blocks and a tail
    request = bench.request(max_new_tokens=B)
    llm.generate(prompt, **request)
    assert timer.take()[0] == 4 * B
    out = llm.generate(prompt[: 2 * B] + [7] * (2 * B + 3), **request)
    assert out.num_cached_tokens == 2 * B and timer.take()[0] == 2 * B
    cold = models.make_llm(replace(bench), "eager", False, {})
    cold.engine.prefill_timer = PrefillTimer()
    cold.generate(prompt, **request)
    cold.generate(prompt, **request)
    assert cold.engine.prefill_timer.take()[0] == 8 * B
