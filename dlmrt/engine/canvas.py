"""CanvasEngine: DiffusionGemma's per-request loop (encoder passes + canvas denoising), eager.

`CanvasEngine` is the reference path (a growing context cache, torch or counter RNG: with torch,
transformers' draws). `StaticCanvasEngine` runs the same loop over the static-shape step of
canvas_static.py in one of the runners of canvas_runners.py (eager, round_graph, block_graph).

encode the prompt (writes the context cache) -> for each canvas: uniform-random init, denoising
steps under `entropy_bound_canvas` until it says done -> append the argmax canvas -> stop at a
stop id (anywhere in the canvas: the output is cut after the first) or once max_new_tokens are
reached -> encode the canvas (a commit forward) before the next one. The last canvas is never
encoded. Canvases start right after the prompt (no block alignment), as in transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from dlmrt.attention import AttnContext
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.engine.canvas_arena import ContextArena
from dlmrt.engine.canvas_runners import RUNNERS
from dlmrt.engine.canvas_static import CanvasBuffers, CanvasSpec, begin, encode
from dlmrt.engine.engine import BlockCallback, EngineResult
from dlmrt.engine.runner_cache import RunnerCache
from dlmrt.errors import GenerationCancelled


class CanvasEngine:
    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.canvas_length: int = model.cfg.canvas_length
        self.vocab: int = model.cfg.vocab_size
        self.embed_dtype = model.embed_table.dtype

    name = "eager"  # EngineResult.mode

    @torch.inference_mode()
    def generate(
        self,
        prompt: list[int],
        settings: ebc.CanvasSettings,
        *,
        max_new_tokens: int,
        stop_ids: list[int],
        seed: int = 0,
        rng: str = "torch",
        ignore_eos: bool = False,
        on_block: BlockCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> EngineResult:
        noise = ebc.make_noise(rng, seed, self.vocab, self.device)
        cache = self.model.new_cache(self.device)
        if prompt:  # an empty prompt has no encoder pass (the first canvas starts at position 0)
            self._encode(prompt, 0, cache)
        start = [len(prompt)]

        def denoise(index: int) -> tuple[torch.Tensor, int]:
            return self._denoise(start[0], settings, noise, index, cache, should_stop)

        def commit(canvas: list[int]) -> None:
            self._encode(canvas, start[0], cache)
            start[0] += self.canvas_length

        res = self._loop(denoise, commit, max_new_tokens, stop_ids, ignore_eos, on_block)
        res.prefill_forwards = int(bool(prompt))
        return res

    def _loop(
        self, denoise, commit, max_new_tokens, stop_ids, ignore_eos, on_block
    ) -> EngineResult:
        """The request's canvas loop (shared with the static engine): denoise(index) -> (argmax
        canvas on the device, steps); commit(canvas ids) encodes it before the next canvas."""
        res = EngineResult([], "length", prefill_forwards=1, mode=self.name)
        stops = torch.tensor(stop_ids, dtype=torch.long, device=self.device)
        canvas: list[int] = []
        for index in range(math.ceil(max_new_tokens / self.canvas_length)):
            if index:
                commit(canvas)
                res.commit_forwards += 1
            tokens, steps = denoise(index)
            res.denoising_forwards += steps
            res.rounds_per_block.append(steps)
            canvas = tokens.tolist()
            res.token_ids += canvas
            if not ignore_eos and stop_ids and bool(torch.isin(tokens, stops).any()):
                first = next(i for i, t in enumerate(canvas) if t in stop_ids)
                del res.token_ids[len(res.token_ids) - len(canvas) + first + 1 :]
                res.finish_reason = "stop"
            if on_block is not None:
                on_block(index, steps, res.token_ids[:max_new_tokens])
            if res.finish_reason == "stop" or len(res.token_ids) >= max_new_tokens:
                break
        if len(res.token_ids) > max_new_tokens:
            res.token_ids, res.finish_reason = res.token_ids[:max_new_tokens], "length"
        return res

    def _encode(self, ids: list[int], start: int, cache) -> None:
        pos = torch.arange(start, start + len(ids), device=self.device)
        rows = torch.tensor(ids, dtype=torch.long, device=self.device)
        self.model(rows, AttnContext(pos, block_size=1), 0, compute_logits=False, cache=cache)

    def _denoise(self, start: int, s: ebc.CanvasSettings, noise, index: int, cache, should_stop):
        """Refine one canvas; -> (argmax canvas [L] on the device, denoising steps taken)."""
        length = self.canvas_length
        pos = torch.arange(start, start + length, device=self.device)
        ctx = AttnContext(pos, block_size=1)
        canvas = noise.canvas(length, index, s.max_denoising_steps + 1)
        history = torch.full((s.stability_threshold, length), -1, device=self.device)
        sc, argmax, taken = None, canvas, 0
        for step in range(s.max_denoising_steps, 0, -1):
            if should_stop is not None and should_stop():
                raise GenerationCancelled("request cancelled")
            logits = self.model(canvas, ctx, length, sc, cache=cache)
            z = logits / ebc.temperature(s, step, self.device)
            probs = torch.softmax(z, dim=-1, dtype=torch.float32)
            sampled = noise.sample(probs, index, step)
            argmax = torch.argmax(z, dim=-1)
            entropy = ebc.token_entropy(z)
            accepted = ebc.accept(entropy, s.entropy_bound)
            canvas = torch.where(accepted, sampled, noise.canvas(length, index, step))
            done = ebc.is_stable(history, argmax) & (entropy.mean() < s.confidence_threshold)
            history = ebc.push(history, argmax)
            sc, taken = z.to(self.embed_dtype), taken + 1
            if bool(done):  # eager: one host read per step (the graph mode keeps it on device)
                break
        return argmax, taken


class StaticCanvasEngine(CanvasEngine):
    """The static-shape path (graph modes; `mode="eager"` runs the same step from a host loop).

    One context arena per engine (engine/canvas_arena.py), sized to prompt + whole canvases + one
    spare canvas (the graph warm-ups write there) rounded up to ARENA_QUANTUM rows, and grown
    (rarely) to the largest request; per `CanvasSettings`, one set of static buffers and one
    runner whose graphs are captured once and reused across canvases and requests. A growth drops
    the runners (their graphs hold pointers into the old arena): the next request recaptures.
    Counter RNG only (`rng="counter"`): same tokens as `CanvasEngine(rng="counter")`.
    """

    ARENA_QUANTUM = 1024

    def __init__(self, model: torch.nn.Module, device: torch.device, mode: str = "eager") -> None:
        super().__init__(model, device)
        self.name = mode
        self.arena: ContextArena | None = None
        self._runners = RunnerCache()  # CanvasSettings -> runner (settings are graph constants)
        self._pool = torch.cuda.graph_pool_handle() if mode != "eager" else None

    def _arena(self, rows: int) -> ContextArena:
        if self.arena is None or self.arena.max_len < rows:
            size = -(-rows // self.ARENA_QUANTUM) * self.ARENA_QUANTUM
            self.arena = None
            self._runners.clear()  # graphs hold pointers into the old arena
            self.arena = ContextArena(self.model.cfg, size, self.embed_dtype, self.device)
        return self.arena

    def _runner(self, settings: ebc.CanvasSettings):
        def build():
            spec = CanvasSpec(self.model, settings)
            buf, cls = CanvasBuffers(spec, self.device), RUNNERS[self.name]
            pool = () if self.name == "eager" else (self._pool,)
            return cls(spec, buf, self.arena, *pool)

        return self._runners.fetch(settings, build)

    @torch.inference_mode()
    def generate(
        self,
        prompt: list[int],
        settings: ebc.CanvasSettings,
        *,
        max_new_tokens: int,
        stop_ids: list[int],
        seed: int = 0,
        rng: str = "counter",
        ignore_eos: bool = False,
        on_block: BlockCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> EngineResult:
        if rng != "counter":
            raise ValueError(f"rng: the static canvas path draws counter noise only, got {rng!r}")
        length = self.canvas_length
        canvases = math.ceil(max_new_tokens / length)
        arena = self._arena(len(prompt) + (canvases + 1) * length)
        if prompt:  # the prompt's encoder pass: eager, variable length
            ids = torch.tensor(prompt, dtype=torch.long, device=self.device)
            encode(self.model, arena, ids, torch.zeros((), dtype=torch.long, device=self.device))
        runner = self._runner(settings)
        runner.should_stop = should_stop
        begin(runner.spec, runner.buf, len(prompt), seed)

        def denoise(index: int) -> tuple[torch.Tensor, int]:
            steps = runner.run_canvas(settings.max_denoising_steps)
            return runner.buf.argmax, steps

        def commit(canvas: list[int]) -> None:
            runner.advance()  # encodes buf.argmax (== canvas) on the device

        res = self._loop(denoise, commit, max_new_tokens, stop_ids, ignore_eos, on_block)
        res.prefill_forwards = int(bool(prompt))
        return res
