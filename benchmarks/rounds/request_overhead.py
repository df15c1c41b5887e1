"""Where one request's time goes, phase by phase, per mode (issue 23): host time and GPU time.

    python -m benchmarks.rounds.request_overhead                       # the demo model, 40 test problems
    python -m benchmarks.rounds.request_overhead --model qwen_dlm --context 8192 --requests 2
    python -m benchmarks.rounds.request_overhead --model llada2 --requests 3
    python -m benchmarks.rounds.request_overhead --device cpu --requests 2   # smoke test: eager only,
                                                               # timings meaningless, no events

Each phase is one engine entry point wrapped with a host clock and, on CUDA, a pair of CUDA events
(so the GPU time of a phase is the span its work took on the stream): tokenize, prefill, stage (a
block's inputs: one host write), then per mode either chain:copy_in+start+...+copy_out (block_graph:
the whole block in one launch) or pass:copy_in, pass:start, loop:fold, loop:rounds, pass:report,
pass:copy_out (eager, round_graph), read_back (the block's one sync), emit (stop rule, token lists),
pass:commit (fold off), detokenize. `python` is the wall time no phase covers (the loop between
them); `host_beyond_gpu_ms` is wall minus the GPU's busy time (the sum of the event spans: one
stream, so they do not overlap). Memory per mode: peak allocated / reserved beyond the weights and
the KV arena. demo: the embedded model on arithmetic test problems, greedy, every prompt warmed up
once first (graph capture, JIT), then timed once uninstrumented (`plain_tokens_per_s`); qwen_dlm / llada2: full-size shapes, random bf16 weights, random
prompts of `--context` tokens, fixed_steps / llada_editing.
"""

from __future__ import annotations

import argparse
import functools
import gc
import time
from collections import defaultdict

import torch

import dlmrt.engine.block.engine as engine_mod
from benchmarks.common import command_line, random_model, write_result
from dlmrt.decoding import make_rule
from dlmrt.engine import BlockEngine
from dlmrt.model_shapes import llada21_mini, qwen_dlm_4b


class Clock:
    """Host seconds and CUDA event pairs per phase; `wrap` times an entry point in place."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.host: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.events: list[tuple[str, object, object]] = []
        self._undo: list[tuple[object, str, object]] = []

    def timed(self, phase, fn):
        def wrapper(*args, **kwargs):
            name = phase(*args) if callable(phase) else phase
            t0 = time.perf_counter()
            if self.cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            out = fn(*args, **kwargs)
            if self.cuda:
                e1.record()
                self.events.append((name, e0, e1))
            self.host[name] += time.perf_counter() - t0
            self.calls[name] += 1
            return out

        return wrapper

    def wrap(self, obj, attr: str, phase) -> None:
        old = getattr(obj, attr)
        self._undo.append((obj, attr, obj.__dict__.get(attr) if hasattr(obj, "__dict__") else old))
        setattr(obj, attr, self.timed(phase, old))

    def unwrap(self) -> None:
        for obj, attr, old in reversed(self._undo):
            if old is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, old)
        self._undo.clear()

    def gpu_ms(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = defaultdict(float)
        for name, e0, e1 in self.events:
            out[name] += e0.elapsed_time(e1)
        return out


def instrument(clock: Clock, engine: BlockEngine, tokenizer=None) -> None:
    """Wrap the entry points of every program the warm-up built (and the tokenizer)."""
    clock.wrap(engine, "prefill", "prefill")
    clock.wrap(engine_mod, "_emit", "emit")
    for prog in engine.workspace.programs.values():
        if prog.runner.name == "block_graph":  # a chain is one launch (its parts are not calls)
            chain = lambda parts, *_: "chain:" + "+".join(p.name for p in parts)  # noqa: E731
            clock.wrap(prog.runner, "chain", chain)
        else:  # a chain is its parts' run / once calls, one after the other
            clock.wrap(prog.runner, "run", lambda loop, *_: "loop:" + loop.name)
        clock.wrap(prog.runner, "once", lambda p: "pass:" + p.name)
        clock.wrap(prog.io, "stage", "stage")
        clock.wrap(prog.io, "read", "read_back")
    if tokenizer is not None:
        clock.wrap(tokenizer, "encode", "tokenize")
        clock.wrap(tokenizer, "decode", "detokenize")


def summarize(clock: Clock, wall: float, tokens: int, rounds: list[int], requests: int) -> dict:
    """One mode's row: totals, per-phase host / GPU ms, host time beyond the GPU's."""
    blocks = len(rounds)
    gpu = clock.gpu_ms()
    phases = {
        name: {
            "calls": clock.calls[name],
            "host_ms": round(clock.host[name] * 1e3, 3),
            "gpu_ms": round(gpu.get(name, 0.0), 3),
        }
        for name in sorted(clock.host)
    }
    covered = sum(clock.host.values())
    busy = sum(gpu.values())
    return {
        "requests": requests,
        "tokens": tokens,
        "blocks": blocks,
        "rounds": sum(rounds),
        "ms_per_round": round(wall * 1e3 / max(sum(rounds), 1), 4),
        "wall_ms": round(wall * 1e3, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "python_ms": round((wall - covered) * 1e3, 3),
        "gpu_busy_ms": round(busy, 3),
        "host_beyond_gpu_ms_per_request": round((wall * 1e3 - busy) / requests, 4),
        "host_beyond_gpu_us_per_block": round((wall * 1e3 - busy) * 1e3 / max(blocks, 1), 2),
        "phases": phases,
    }


def memory(engine: BlockEngine, weights: int) -> dict:
    if not torch.cuda.is_available():
        return {}
    arena = engine.workspace.arena.nbytes if engine.workspace.arena is not None else 0
    gib = 2**30
    return {
        "weights_gib": round(weights / gib, 3),
        "arena_gib": round(arena / gib, 3),
        "peak_allocated_beyond_gib": round((torch.cuda.max_memory_allocated() - weights - arena) / gib, 3),
        "peak_reserved_beyond_gib": round((torch.cuda.max_memory_reserved() - weights - arena) / gib, 3),
        "graphs": {str(k): sorted(p.runner.graphs) for k, p in engine.workspace.programs.items()
                   if hasattr(p.runner, "graphs")},
        "prefill_graphs": sorted(map(str, getattr(engine.workspace.extras.get("prefill"), "graphs", {}))),
    }  # fmt: skip


def demo_requests(args, mode: str, device: str) -> tuple[dict, list[list[int]]]:
    """The embedded model on `--requests` arithmetic test problems, each warmed up once first."""
    from dlmrt import LLM
    from dlmrt.tasks.arithmetic import problems

    llm = LLM(device=device, mode=mode, prefix_reuse=False)  # cold prefills
    prompts = [p.question for p in problems("test", args.requests)]
    kw = dict(max_new_tokens=args.new_tokens)
    for prompt in prompts:  # warm-up: every prompt length's graphs, Triton JIT, cuBLAS
        llm.generate(prompt, **kw)
    weights = sum(p.nbytes for p in llm.model.parameters())
    _sync(device)
    t0 = time.perf_counter()
    for prompt in prompts:  # the same requests uninstrumented: the speed a user sees
        llm.generate(prompt, **kw)
    _sync(device)
    plain = time.perf_counter() - t0
    clock, tokens, rounds, outs = Clock(device == "cuda"), 0, [], []
    instrument(clock, llm.engine, llm.tokenizer)
    _sync(device)
    t0 = time.perf_counter()
    for prompt in prompts:
        out = llm.generate(prompt, **kw)
        tokens, rounds = tokens + len(out.token_ids), rounds + out.rounds_per_block
        outs.append(out.token_ids)
    _sync(device)
    wall = time.perf_counter() - t0
    clock.unwrap()
    row = summarize(clock, wall, tokens, rounds, len(prompts))
    row |= {"mode": llm.engine.mode, "memory": memory(llm.engine, weights)}
    row |= {"plain_wall_ms": round(plain * 1e3, 3), "plain_tokens_per_s": round(tokens / plain, 1)}
    return row, outs


def shape_model(args, device: str):
    """The full-size model (random bf16 weights, seeded: every mode runs the same one) and its rule."""
    dev = torch.device(device)
    torch.manual_seed(0)
    if args.model == "qwen_dlm":
        cfg = qwen_dlm_4b(args.layers or 36)
        return cfg, random_model(cfg, dev), make_rule("fixed_steps", denoising_steps=23)
    from dlmrt.models.llada2 import LLaDA2

    cfg = llada21_mini(args.layers or 20)
    model = random_model(cfg, dev, cls=LLaDA2)
    return cfg, model, make_rule("llada_editing", editing="quality")


def shape_requests(args, mode: str, device: str, built) -> tuple[dict, list[list[int]]]:
    """Full-size shapes: `--requests` random prompts of `--context` through a fresh engine over
    the one model `built` (so memory beyond weights + arena is this mode's alone)."""
    cfg, model, rule = built
    weights = sum(p.nbytes for p in model.parameters())
    _reset_peak(device)
    engine = BlockEngine(model, torch.device(device), torch.bfloat16, mode)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, 150000, (args.context,), generator=gen).tolist()
        for _ in range(args.requests)
    ]
    kw = dict(rule=rule, block_length=cfg.block_size, max_new_tokens=args.new_tokens,
              mask_id=cfg.mask_token_id, stop_ids=set(), ignore_eos=True)  # fmt: skip
    with torch.inference_mode():
        engine.generate(prompts[0], **kw)  # warm-up: capture, JIT (same length as every prompt)
        clock, outs, rounds = Clock(device == "cuda"), [], []
        instrument(clock, engine)
        _sync(device)
        t0 = time.perf_counter()
        for prompt in prompts:
            res = engine.generate(prompt, **kw)
            outs.append(res.token_ids)
            rounds += res.rounds_per_block
        _sync(device)
        wall = time.perf_counter() - t0
    clock.unwrap()
    row = summarize(clock, wall, sum(map(len, outs)), rounds, len(prompts))
    row |= {"mode": mode, "memory": memory(engine, weights)}
    return row, outs


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    """Peak statistics from here; the previous mode's engine (graphs hold reference cycles) freed."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", choices=["demo", "qwen_dlm", "llada2"], default="demo")
    ap.add_argument("--modes", nargs="+", default=["eager", "round_graph", "block_graph"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=None, help="default: 128 demo, 512 shapes")
    ap.add_argument("--context", type=int, default=200, help="prompt tokens (full-size shapes)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (full-size shapes)")
    ap.add_argument(
        "--out", default=None, help="default benchmarks/results/request_overhead_<model>.json"
    )
    ap.add_argument("--git-revision", default=None)
    return ap.parse_args()


def main() -> None:
    args = _args()
    if args.device == "cpu":
        args.modes = ["eager"]  # the graph modes need CUDA
    args.new_tokens = args.new_tokens or (128 if args.model == "demo" else 512)
    run = demo_requests
    if args.model != "demo":  # one model for every mode
        run = functools.partial(shape_requests, built=shape_model(args, args.device))
    rows, tokens = [], {}
    for mode in args.modes:
        _reset_peak(args.device)
        row, tokens[mode] = run(args, mode, args.device)
        rows.append(row)
        print(f"{mode:>12} {row['tokens_per_s']:>10.1f} tok/s  host beyond GPU "
              f"{row['host_beyond_gpu_ms_per_request']:.3f} ms/request, "
              f"{row['host_beyond_gpu_us_per_block']:.1f} us/block", flush=True)  # fmt: skip
        for name, ph in row["phases"].items():
            print(
                f"    {name:<18} {ph['calls']:>6} calls  host {ph['host_ms']:>9.3f} ms  gpu {ph['gpu_ms']:>9.3f} ms"
            )
    same = len({tuple(map(tuple, t)) for t in tokens.values()}) == 1
    print("tokens identical across modes:", same)
    write_result(
        args.out or f"benchmarks/results/request_overhead_{args.model}.json",
        {"benchmark": "request_overhead", "command": command_line(), "model": args.model,
         "device_kind": args.device, "new_tokens": args.new_tokens, "context": args.context,
         "tokens_identical_across_modes": same, "results": rows},
        args.git_revision,
    )  # fmt: skip


if __name__ == "__main__":
    main()
