"""EncoderDecoderEngine: DiffusionGemma's per-request loop over the static step, in one of three modes.

The request loop is `dlmrt/canvas_loop.py` (shared with the oracle, `dlmrt/reference/canvas.py`);
here its two callbacks run a `CanvasProgram` through the mode machinery (`dlmrt/engine/graph/`):

    steps    Loop  `canvas_step` while not done and step < max_denoising_steps
    advance  Pass  commit the finished canvas (encoder pass over its rows), start the next one

The workspace holds one context arena, sized to prompt + whole canvases + one spare canvas (graph
warm-ups write there) and grown (rarely) to the largest request, the graph pool, and one program
per `CanvasSettings` (the settings are graph constants). Counter noise only: requests asking for
torch's draws (`rng="torch"`, transformers' noise, not replayable in a graph) run the oracle,
which this engine calls for them (logged once; such results say mode "eager").
Prefix reuse (`engine/prefix.py`): the prompt's rows and the committed canvases' rows outlive the
request; the next one reuses the longest common prefix of its prompt with them, to the token (the
encoder pass is causal), and encodes only the rest.
"""

from __future__ import annotations

import logging
import math

import torch

from dlmrt import reference
from dlmrt.attention import AttnContext
from dlmrt.canvas_loop import canvas_loop
from dlmrt.config import EAGER
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.engine import nonfinite
from dlmrt.engine.block.structured import Constraint
from dlmrt.engine.encoder_decoder import structured, vocab_choice
from dlmrt.engine.encoder_decoder.step import (
    CanvasBuffers,
    CanvasSpec,
    advance,
    begin,
    canvas_step,
    encode,
    read_trace,
)
from dlmrt.engine.graph.loop import Loop, Pass, Runner
from dlmrt.engine.graph.prefill import PrefillGraphs
from dlmrt.engine.graph.workspace import Workspace
from dlmrt.engine.kv_cache import ContextArena, arena_dtype
from dlmrt.engine.prefill_timer import PrefillTimer, prefill_span
from dlmrt.engine.prefix import Prefix
from dlmrt.outputs import CanvasRecorder, EngineResult, ProgressCallback, StopCheck

ENCODE_GRANULE = 16  # the prompt's encoder pass is padded to a multiple of this many rows

log = logging.getLogger("dlmrt")


class CanvasProgram:
    """Static buffers of one `CanvasSettings`, its step loop and its advance pass."""

    def __init__(self, spec: CanvasSpec, arena: ContextArena, runner: Runner, device) -> None:
        self.spec, self.arena, self.runner = spec, arena, runner
        self.buf = buf = CanvasBuffers(spec, device)
        cap = spec.settings.max_denoising_steps
        step = lambda: canvas_step(spec, buf, arena)  # noqa: E731
        self.steps = Loop("steps", step, buf.done, buf.step, cap, (buf,))
        self.advance = Pass("advance", lambda: advance(spec, buf, arena), (buf,))


class EncoderDecoderEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        mode: str = EAGER,
        kv_cache_dtype: str = "auto",
        prefix_reuse: bool = False,
    ) -> None:
        """prefix_reuse: keep the prompt's and the committed canvases' context rows for the next
        request (`engine/prefix.py`); off for an engine built directly (benchmarks time cold
        requests), on through `LLM` by default."""
        self.model, self.device, self.mode = model, device, mode
        self.canvas_length: int = model.cfg.canvas_length
        self.embed_dtype = model.embed_table.dtype
        self.kv_dtype = arena_dtype(kv_cache_dtype, self.embed_dtype)  # kv_cache.py: FP8 arena
        self.workspace = Workspace(mode, self._new_arena, device)
        self._torch_rng_logged = False
        self.prefix = Prefix(prefix_reuse)  # the context rows the next request reuses
        self.prefill_timer: PrefillTimer | None = None  # set by a benchmark (prefill_timer.py)

    def _new_arena(self, rows: int) -> ContextArena:
        self.prefix.clear()  # its rows live in the old arena: holding it keeps it allocated
        return ContextArena(self.model.cfg, rows, self.kv_dtype, self.device)

    def program(self, settings: ebc.CanvasSettings, rows: int, trace: bool = False):
        """The program for `settings` over an arena of at least `rows` rows (documented for
        the benchmarks: `program.runner.run(program.steps)` times a canvas's steps). `trace`: a
        program whose steps also write the step history (its own buffers and graphs)."""
        arena = self.workspace.reserve(rows)
        spec = CanvasSpec(self.model, settings, trace, vocab_choice.canvas_vocab_kernel(self.model))
        key = settings if not trace else (settings, "trace")
        return self.workspace.program(key, lambda run: CanvasProgram(spec, arena, run, self.device))

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
        on_progress: ProgressCallback | None = None,
        should_stop: StopCheck | None = None,
        recorder: CanvasRecorder | None = None,
        constraint: Constraint | None = None,
    ) -> EngineResult:
        """Decode one request (rng "counter"; rng "torch" and a structured request's `constraint`
        through the oracle). `recorder` gets every step's `CanvasStepRecord`, in every mode,
        after each canvas (before its `on_progress`). The prompt's leading tokens that earlier
        requests left in the arena are not encoded again (`res.cached_tokens`; the oracle's
        path reuses none and keeps them)."""
        kw = dict(max_new_tokens=max_new_tokens, stop_ids=stop_ids, ignore_eos=ignore_eos)
        hooks = dict(on_progress=on_progress, should_stop=should_stop, recorder=recorder)
        if constraint is not None or rng == "torch":
            self.prefix.reused = 0  # the oracle's own cache: the arena's held rows stay as they are
            return self._generate_reference(prompt, settings, seed, rng, constraint, hooks | kw)
        if rng != "counter":
            raise ValueError(f"rng: expected 'torch' or 'counter', got {rng!r}")
        length = self.canvas_length
        canvases = math.ceil(max_new_tokens / length)
        prog = self.program(settings, len(prompt) + (canvases + 1) * length, recorder is not None)
        reused = self._context(prompt, prog.arena)
        begin(prog.spec, prog.buf, len(prompt), seed)
        starts = iter(range(len(prompt), len(prompt) + canvases * length, length))

        def denoise(index: int) -> tuple[torch.Tensor, int]:
            prog.runner.run(prog.steps, should_stop)
            # the canvas's one read-back: its step count and whether its last step's
            # probabilities (self-conditioning input) hold NaN / inf (`engine/nonfinite.py`)
            steps, bad = torch.stack((prog.buf.step, nonfinite.flag(prog.buf.sc))).tolist()
            if bad:
                self.prefix.clear()  # keep no K/V of a request that went non-finite
                raise nonfinite.error(self.model, f"canvas {index} (step {steps})")
            if recorder is not None:
                for record in read_trace(prog.buf, index, steps):
                    recorder(record)
            return prog.buf.argmax, steps

        def commit(canvas: list[int]) -> None:
            prog.runner.once(prog.advance)  # encodes buf.argmax (== canvas) on the device
            self.prefix.commit(next(starts), canvas)  # clean now (its decoder passes: scratch)

        mode = prog.runner.name
        res = canvas_loop(
            denoise, commit, canvas_length=length, on_progress=on_progress, mode=mode, **kw
        )
        res.prefill_forwards, res.cached_tokens = int(reused < len(prompt)), reused
        return res

    def _generate_reference(
        self, prompt: list[int], settings: ebc.CanvasSettings, seed: int, rng: str, constraint, kw
    ) -> EngineResult:
        """The request on the eager oracle: rng="torch" (transformers' draws; no graphs), or a
        structured request (its grammar between each step's forward and its sampling)."""
        if constraint is not None:
            return structured.generate(self.model, prompt, settings, seed, rng, constraint, kw)
        self._log_torch_rng()
        return reference.canvas.generate(self.model, prompt, settings, seed=seed, rng=rng, **kw)

    def _context(self, prompt: list[int], arena: ContextArena) -> int:
        """Write the prompt's context rows; -> how many of them earlier requests left in the
        arena (reused, not encoded again). Granule 1: the encoder pass is causal, so a context
        row's K/V depend only on the tokens up to it (sliding windows only narrow which)."""
        reused = self.prefix.take(prompt, 1, arena, len(prompt))
        if reused < len(prompt):  # graphs per length bucket in the graph modes
            with prefill_span(self.prefill_timer, len(prompt) - reused, self.device):
                self._encode_prompt(prompt, arena, reused)
            self.prefix.commit(reused, prompt[reused:])
        return reused

    def _encode_prompt(self, prompt: list[int], arena: ContextArena, start: int = 0) -> None:
        """The prompt's causal encoder pass over rows [start, len(prompt)) (the rows before
        `start` hold their K/V already: a reused prefix, any row). Graph modes: captured chunks
        per length bucket from `start`, padded to a multiple of `ENCODE_GRANULE` rows
        (`engine/graph/prefill.py`: a padded row sits after every real one, so causal attention
        hides it, and it writes only arena rows a canvas pass writes before reading). Eager mode
        on CUDA: the same padded chunks, run eagerly (every mode the same shapes, so the same
        tokens); the CPU: one unpadded pass."""
        ws = self.workspace
        if self.device.type == "cuda" and arena is ws.arena:
            # dropped with the arena: the graphs hold pointers into it
            graphs = ws.extra("prefill", lambda: self.encoder_graphs(arena, ws.pool))
            if graphs.run(prompt, ENCODE_GRANULE, start):
                return
        ids = torch.tensor(prompt[start:], dtype=torch.long, device=self.device)
        encode(self.model, arena, ids, torch.full((), start, dtype=torch.long, device=self.device))

    def encoder_graphs(self, arena: ContextArena, pool=None) -> PrefillGraphs:
        """Prompt encoder chunks over `arena` (pool None: run eagerly, padded as the graphs are:
        tests)."""
        model = self.model

        def forward(ids, positions, _granule: int, _kv_len) -> None:  # the mask is on the device
            model(ids, AttnContext(positions, 1, arena), 0, compute_logits=False)

        return PrefillGraphs(forward, arena.max_len, self.device, pool)

    def _log_torch_rng(self) -> None:
        if self.mode != EAGER and not self._torch_rng_logged:
            log.info(
                "rng='torch' (transformers' draws) cannot be replayed in a CUDA graph: such "
                "requests run on the eager reference path (mode 'eager' in their output)"
            )
            self._torch_rng_logged = True
