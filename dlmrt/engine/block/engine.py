"""BlockEngine: the block style's per-request loop (QwenDLM, LLaDA2), in one of three modes.

prefill the full prompt blocks -> for each block: denoising rounds until the rule says done ->
commit pass (clean tokens, writes the block's KV) -> stop at a stop id or max_new_tokens.
With `fold_commits` (the default; `fold.py`) a block's commit pass is not a forward of its own: it
runs as the first half of the next block's round 0, one forward over both blocks (for editing
rules, with the block's post-fill checks). Same tokens. Counting: every forward is counted once;
a joint pass is a denoising forward (its logits feed the rule), so `commit_forwards` counts only
stand-alone commit passes, and `rounds_per_block` the rule's rounds per block as unfolded (a
joint pass is a round of both blocks it serves, so their sum may exceed denoising_forwards).
The mode machinery (`dlmrt/engine/graph/`) runs the program's loops; the workspace holds the
arena, the graph pool and the programs. The engine knows nothing about text: token ids in and out.
Prefix reuse (`engine/prefix.py`): the arena's committed rows outlive the request; the next one
reuses the whole blocks its prompt shares with them and prefills only the rest.
"""

from __future__ import annotations

import logging

import torch

from dlmrt.attention import AttnContext
from dlmrt.blocks import layout
from dlmrt.config import EAGER
from dlmrt.decoding import DecodeRule
from dlmrt.engine import nonfinite
from dlmrt.engine.block.fold import folds_check
from dlmrt.engine.block.program import BlockProgram
from dlmrt.engine.block.request import BlockRequest, emit, launch
from dlmrt.engine.block.round import RoundSpec
from dlmrt.engine.block.structured import Constraint, run_blocks
from dlmrt.engine.block.token_feed import TokenFeed
from dlmrt.engine.graph.prefill import PrefillGraphs
from dlmrt.engine.graph.workspace import Workspace
from dlmrt.engine.kv_cache import KVCache, arena_dtype
from dlmrt.engine.prefill_timer import PrefillTimer, prefill_span
from dlmrt.engine.prefix import Prefix
from dlmrt.outputs import (
    EngineResult,
    ProgressCallback,
    Recorder,
    RoundViewCallback,
    StopCheck,
    TokensCallback,
)

log = logging.getLogger("dlmrt")


def _settle(
    prog: BlockProgram, res: EngineResult, req: BlockRequest, index: int, prefix: Prefix
) -> bool:
    """After the joint passes that carried block `index`-1's folded check: its tokens are final
    now, and so are the K/V the last pass wrote for them (its commit); count the passes, emit the
    block. True if that block ended the request."""
    fold = prog.io.read_fold()  # one copy + sync (the `fold_out` pass)
    if fold.redo:
        raise RuntimeError(f"block {index - 1}: the folded check still edits after the last pass")
    prefix.commit((index - 1) * req.lay.block_length, fold.canvas)
    res.denoising_forwards += fold.passes
    return emit(res, req, index - 1, fold.step, fold.canvas)


class BlockEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        dtype: torch.dtype,
        mode: str = EAGER,
        fold_commits: bool = True,
        kv_cache_dtype: str = "auto",
        prefix_reuse: bool = False,
        stream_rounds: bool = True,
    ) -> None:
        """prefix_reuse: keep the committed rows for the next request (`engine/prefix.py`); off
        for an engine built directly (benchmarks time cold requests), on through `LLM` by default.
        stream_rounds: a request with `on_tokens` hears its rows as they become final, every
        round (`token_feed.py`); False: at each finished block only."""
        self.model, self.cfg, self.device, self.dtype = model, model.cfg, device, dtype
        self.kv_dtype = arena_dtype(kv_cache_dtype, dtype)  # kv_cache.py: the FP8 arena
        self.mode = mode
        self.fold_commits = fold_commits  # fold.py: commits ride in the next block's round 0
        self.workspace = Workspace(mode, self._new_arena, device)
        self.prefix = Prefix(prefix_reuse)  # the committed rows the next request reuses
        self.stream_rounds = stream_rounds
        self.prefill_timer: PrefillTimer | None = None  # set by a benchmark (prefill_timer.py)

    def _new_arena(self, rows: int) -> KVCache:
        self.prefix.clear()  # its rows live in the old arena: holding it keeps it allocated
        c = self.cfg
        heads, dim = c.num_key_value_heads, c.head_dim
        return KVCache(c.num_hidden_layers, heads, dim, rows, self.kv_dtype, self.device)

    def program(
        self, spec: RoundSpec, max_len: int, traced: bool = False, stream: str | None = None
    ) -> BlockProgram:
        """The program for `spec` over an arena of at least `max_len` rows (documented for the
        benchmarks: `program.runner.run(program.rounds)` times a block's rounds). `traced`: its
        rounds also write the device-side `RoundTrace` a recorder reads after each block.
        `stream`: what its rounds also publish to the round stream (`program.py`)."""
        kv = self.workspace.reserve(max_len)
        key = (spec.block_length, spec.rule, spec.temperature, spec.one_pass, traced, stream)
        return self.workspace.program(
            key, lambda run: BlockProgram(spec, kv, run, self.device, traced, stream)
        )

    def generate(
        self,
        prompt_ids: list[int],
        *,
        rule: DecodeRule,
        block_length: int,
        max_new_tokens: int,
        mask_id: int,
        stop_ids: set[int],
        temperature: float = 0.0,
        seed: int = 0,
        ignore_eos: bool = False,
        recorder: Recorder | None = None,
        on_progress: ProgressCallback | None = None,
        should_stop: StopCheck | None = None,
        constraint: Constraint | None = None,
        on_tokens: TokensCallback | None = None,
        on_view: RoundViewCallback | None = None,
    ) -> EngineResult:
        """Decode one request. A `recorder` gets one `RoundRecord` per round of the unfolded
        schedule (what the trainer replays), in any mode: the rounds write a device-side trace,
        handed over after each finished block (`trace.py`); the request then runs unfolded, at the
        cost of the commit passes. Same tokens either way. The prompt's blocks it shares with the
        rows the earlier requests committed are not prefilled again (`res.cached_tokens`). A
        `constraint` (structured output) decides every round through its grammar on the host
        (`structured.py`). `on_tokens(tokens)`: the output so far each time it grows, every
        round where the program streams (`token_feed.py`), else at each finished block. `on_view`:
        every round as the round stream shows it (drafts, live; the request runs unfolded)."""
        if constraint is not None and (recorder is not None or on_view is not None):
            raise ValueError("response_format: not supported with a recorder or drafts")
        lay = layout(len(prompt_ids), max_new_tokens, block_length)
        # a structured request masks the logits before the rule: never the one-pass vocabulary
        spec = RoundSpec(self.model, rule, temperature, block_length, constraint is None)
        stream = self._stream(rule, on_tokens, on_view, recorder, constraint)
        with torch.inference_mode():
            prog = self.program(spec, lay.max_len, recorder is not None, stream)
            feed = None
            if on_tokens is not None or on_view is not None:
                cut = (stop_ids, max_new_tokens, ignore_eos)
                # with drafts, the text goes by blocks: a block's drafts come before its text
                final = not getattr(rule, "edits", False) and on_view is None
                feed = TokenFeed(on_tokens, lay, *cut, prog.rows_out, final, on_view)
            req = BlockRequest(
                lay, stop_ids, max_new_tokens, ignore_eos, on_progress, should_stop, recorder, feed
            )
            res = EngineResult([], "length", mode=prog.runner.name)
            full = lay.first_block * block_length  # the rows a cold request prefills
            reused = self.prefix.take(prompt_ids, block_length, prog.kv, full)
            res.cached_tokens = reused
            if reused < full:
                with prefill_span(self.prefill_timer, full - reused, self.device):
                    self.prefill(prompt_ids[:full], block_length, prog.kv, start=reused)
                res.prefill_forwards = 1
                self.prefix.commit(reused, prompt_ids[reused:full])
            if constraint is not None:
                run_blocks(self, prog, prompt_ids, mask_id, seed, req, res, constraint, emit)
            else:
                self._blocks(prog, prompt_ids, mask_id, seed, req, res)
        return res

    def _stream(self, rule, on_tokens, on_view, recorder, constraint) -> str | None:
        """What the program's rounds publish (`program.py`): "drafts" for live drafts; "rows"
        for tokens every round (rules that do not edit; not where the host decides the rows, a
        constraint, or a recorder's drafts come from the trace); else nothing."""
        if on_view is not None:
            if not self.stream_rounds or recorder is not None:
                raise ValueError("on_view: needs stream_rounds and no recorder")
            return "drafts"
        rows = on_tokens is not None and self.stream_rounds and not getattr(rule, "edits", False)
        return "rows" if rows and constraint is None and recorder is None else None

    def _blocks(self, prog, prompt_ids, mask_id, seed, req, res) -> None:
        """The block loop of `generate`: per block one chain of programs (`runner.chain`: one
        launch in block_graph): the staged copy in, the start pass, the folded commit, the round
        loop, the report pass and the copy out, then one read-back (`block_io.py`). A folded
        post-fill check is read between the commit and the rounds (two chains)."""
        lay, spec, runner = req.lay, prog.spec, prog.runner
        drafts = prog.rows_out is not None and prog.rows_out.drafts
        fold = self.fold_commits and prog.trace is None and not drafts  # drafts: unfolded
        check = fold and folds_check(spec)  # post-fill checks ride in the joint passes too
        unsettled = False  # block b-1 awaits its folded check: its tokens are not final yet
        waiting: list[int] = []  # block b-1's final tokens, awaiting their folded commit
        for b in range(lay.first_block, lay.num_blocks):
            pending = fold and b > lay.first_block  # block b-1 awaits its commit (and check)
            last = b == lay.num_blocks - 1
            tail = prompt_ids[b * lay.block_length :] if b == lay.first_block else []
            prog.io.stage(tail, mask_id, b * lay.block_length, seed, check and not last)
            prog.kv_len = self._kv_len(b, lay.block_length)
            head = (prog.io.copy_in, prog.start_after if pending else prog.start)
            head += (prog.fold,) if pending else ()
            tail_parts = (prog.rounds, prog.report, prog.io.copy_out)
            if pending and unsettled:  # the host reads the folded check before the rounds
                runner.chain((*head, prog.io.fold_out), req.should_stop)
                if _settle(prog, res, req, b, self.prefix):
                    return  # block b-1 ended the request: block b's round 0 goes unused
                runner.chain(tail_parts, req.should_stop)
            else:  # one launch in block_graph: copy in .. copy out
                launch(prog, head + tail_parts, req, b, res.token_ids)
                if pending:  # the chain ran (not cancelled): so did block b-1's folded commit
                    self.prefix.commit((b - 1) * lay.block_length, waiting)
            feed = req.feed if req.feed is not None and req.feed.streams_rounds else None
            out = prog.io.read(feed.poll if feed else None)  # the block's one read-back
            if feed is not None:
                feed.end_block()
            if out.nonfinite:
                self.prefix.clear()  # keep no K/V of a request that went non-finite
                raise nonfinite.error(spec.model, f"block {b} (round {out.step})")
            if not out.halt:
                raise RuntimeError(
                    f"block {b} did not finish in {prog.rounds.cap} rounds ({spec.rule.name})"
                )
            # out.step counts a joint pass as block b's round 0; `_settle` counted it already
            res.denoising_forwards += out.step - int(pending and unsettled)
            if prog.trace is not None:
                for record in prog.trace.records(b, out.step):
                    req.recorder(record)
            unsettled = check and not last and not out.done
            if unsettled:
                continue  # block b's tokens are final after its folded check
            if emit(res, req, b, out.step, out.canvas):
                return  # the last block's commit pass is skipped: nothing reads its KV
            waiting = out.canvas
            if not fold:
                runner.once(prog.commit)
                res.commit_forwards += 1
                self.prefix.commit(b * lay.block_length, out.canvas)

    def _kv_len(self, index: int, block_length: int) -> int | None:
        # On the CPU, attend to the written rows only. On CUDA every mode reads the visible length
        # from the device, so eager and the graph modes run identical kernels (identical tokens).
        return (index + 1) * block_length if self.device.type == "cpu" else None

    def prefill(self, tokens: list[int], block_length: int, kv: KVCache, start: int = 0) -> None:
        """Clean forward of the full prompt blocks (block-causal); writes their K/V, no logits.
        `start`: the rows before it (whole blocks) hold their K/V already (a reused prefix); only
        rows [start, len(tokens)) run. CUDA: chunks of <= 2048 rows padded to length buckets
        (`engine/graph/prefill.py`), captured graphs in the graph modes, run eagerly in eager
        mode: every mode runs the same shapes, so the same kernels and the same tokens (cuBLAS
        may round a GEMM differently per row count)."""
        if start % block_length or not 0 <= start < len(tokens):
            raise ValueError(
                f"prefill from row {start} of {len(tokens)}: expected a multiple of the block "
                f"length {block_length} below the row count"
            )
        ws = self.workspace
        if self.device.type == "cuda" and kv is ws.arena:
            # dropped with the arena: the graphs hold pointers into it
            graphs = ws.extra("prefill", lambda: self.prefill_graphs(kv, ws.pool))
            if graphs.run(tokens, block_length, start):
                return
        ids = torch.tensor(tokens[start:], dtype=torch.long, device=self.device)
        positions = torch.arange(start, len(tokens), device=self.device)
        kv_len = len(tokens) if self.device.type == "cpu" else None  # CUDA: the Triton kernel
        self.model(ids, AttnContext(positions, block_length, kv, kv_len), compute_logits=False)

    def prefill_graphs(self, kv: KVCache, pool=None) -> PrefillGraphs:
        """Prefill chunks over `kv` (pool None: run eagerly, padded as the graphs are: tests)."""
        model = self.model

        def forward(ids, positions, block_length: int, kv_len: int | None) -> None:
            model(ids, AttnContext(positions, block_length, kv, kv_len), compute_logits=False)

        return PrefillGraphs(forward, kv.max_len, self.device, pool)
