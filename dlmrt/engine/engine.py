"""Engine: the per-request block loop, in one of three execution modes (see `runners.py`).

prefill the full prompt blocks -> for each block: denoising rounds until the rule says done ->
commit pass (clean tokens, writes the block's KV) -> stop at a stop id or max_new_tokens.
With `fold_commits` (the default; `engine/fold.py`) a block's commit pass is not a forward of its
own: it runs as the first half of the next block's round 0, one forward over both blocks (for
editing rules, with the block's post-fill checks). Same tokens. Counting: every forward is counted
once; a joint pass is a denoising forward (its logits feed the rule), so `commit_forwards` counts
only stand-alone commit passes, and `rounds_per_block` the rule's rounds per block as unfolded
(a joint pass is a round of both blocks it serves, so their sum may exceed denoising_forwards).
One KV arena per engine, grown (rarely) to the largest request; per block length, one set of
static buffers and, in graph modes, graphs captured once and reused across requests.
The engine knows nothing about text: it takes and returns token ids.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dlmrt.attention import AttnContext
from dlmrt.blocks import Layout, finish, initial_canvas, layout
from dlmrt.decoding import DecodeRule
from dlmrt.engine.fold import FoldBuffers, folds_check
from dlmrt.engine.kv_cache import KVCache
from dlmrt.engine.round import BlockBuffers, RoundSpec
from dlmrt.engine.runner_cache import RunnerCache
from dlmrt.engine.runners import BlockGraphRunner, EagerRunner, RoundGraphRunner

log = logging.getLogger("dlmrt")
ARENA_QUANTUM = 1024  # the arena grows in steps of this many rows (each growth recaptures graphs)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """What a round consumed and produced (for the trainer): device tensors, cloned.

    They are created under `torch.inference_mode()`: clone them outside it (or use them as
    constants, e.g. the stop-gradient z of replay) before they enter an autograd graph.
    """

    block: int
    round: int
    canvas: torch.Tensor  # [B] canvas the round saw
    unresolved: torch.Tensor  # [B] unresolved rows at the start of the round
    z: torch.Tensor | None  # [B, hidden] pre-adapter residual the round consumed
    entropy: torch.Tensor  # [B] per-row entropy of this round's prediction
    accepted: torch.Tensor  # [B] rows accepted this round
    edited: torch.Tensor | None = None  # [B] resolved rows rewritten this round (editing rules)


@dataclass
class EngineResult:
    token_ids: list[int]
    finish_reason: str
    denoising_forwards: int = 0
    commit_forwards: int = 0
    prefill_forwards: int = 0
    rounds_per_block: list[int] = field(default_factory=list)
    mode: str = "eager"


Recorder = Callable[[RoundRecord], None]
BlockCallback = Callable[[int, int, list[int]], None]  # (block index, rounds, tokens so far)


@dataclass(frozen=True, slots=True)
class _Request:
    """What decides when a request ends, and who hears about each finished block."""

    lay: Layout
    stop_ids: set[int]
    max_new_tokens: int
    ignore_eos: bool
    on_block: BlockCallback | None


def _emit(res: EngineResult, req: _Request, block: int, rounds: int, canvas: torch.Tensor) -> bool:
    """Block `block` is final: append its tokens, apply the stop rule; True if the request ended."""
    res.rounds_per_block.append(rounds)
    tokens = canvas.tolist()
    res.token_ids += tokens[req.lay.tail :] if block == req.lay.first_block else tokens
    res.token_ids, reason = finish(res.token_ids, req.stop_ids, req.max_new_tokens, req.ignore_eos)
    if req.on_block is not None:
        req.on_block(block, rounds, list(res.token_ids))
    if reason is None:
        return False
    res.finish_reason = reason
    return True


def _fold(
    runner,
    fb: FoldBuffers,
    buf: BlockBuffers,
    kv: KVCache,
    kv_len: int | None,
    res: EngineResult,
    req: _Request,
    block: int,
    unsettled: bool,
) -> bool:
    """Joint passes over blocks `block`-1 and `block`; count them. If block-1 awaited its folded
    check, its tokens are final now: emit them. True if that block ended the request."""
    runner.fold(fb, buf, kv, kv_len)
    if not unsettled:
        res.denoising_forwards += 1  # one joint pass: a plain commit is never redone
        return False
    if bool(fb.redo):
        raise RuntimeError(f"block {block - 1}: the folded check still edits after the last pass")
    res.denoising_forwards += int(fb.passes)
    return _emit(res, req, block - 1, int(fb.step), fb.canvas)


class Engine:
    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        dtype: torch.dtype,
        mode: str = "eager",
        fold_commits: bool = True,
    ) -> None:
        self.model, self.cfg, self.device, self.dtype, self.mode = (
            model,
            model.cfg,
            device,
            dtype,
            mode,
        )
        self.fold_commits = fold_commits  # engine/fold.py: commits ride in the next block's round 0
        self.kv: KVCache | None = None
        self._runners = RunnerCache()  # (block, rule, temperature) -> (runner, buffers)
        self._pool = torch.cuda.graph_pool_handle() if mode != "eager" else None

    def _arena(self, max_len: int) -> KVCache:
        if self.kv is None or self.kv.max_len < max_len:
            size = -(-max_len // ARENA_QUANTUM) * ARENA_QUANTUM
            self.kv = None
            self._runners.clear()  # graphs hold pointers into the old arena
            c = self.cfg
            self.kv = KVCache(
                c.num_hidden_layers,
                c.num_key_value_heads,
                c.head_dim,
                size,
                self.dtype,
                self.device,
            )
        return self.kv

    def _runner(self, spec: RoundSpec, recorder_hook) -> tuple[object, BlockBuffers, FoldBuffers]:
        key = (spec.block_size, spec.rule, spec.temperature)

        def build() -> tuple[object, BlockBuffers, FoldBuffers]:
            buf, fb = BlockBuffers(spec, self.device), FoldBuffers(spec, self.device)
            if self.mode == "block_graph":
                rounds = spec.rule.max_rounds(spec.block_size)
                runner = BlockGraphRunner(
                    spec, buf, self.kv, self._pool, rounds, fold=self.fold_commits
                )
            elif self.mode == "round_graph":
                runner = RoundGraphRunner(spec, buf, self.kv, self._pool)
            else:
                runner = EagerRunner(spec)
            return runner, buf, fb

        runner, buf, fb = self._runners.fetch(key, build)
        if recorder_hook is not None and not isinstance(runner, EagerRunner):
            runner = EagerRunner(spec)  # per-round hooks need the host between rounds
        if isinstance(runner, EagerRunner):
            runner.on_round = recorder_hook
        return runner, buf, fb

    def generate(
        self,
        prompt_ids: list[int],
        *,
        rule: DecodeRule,
        block_size: int,
        max_new_tokens: int,
        mask_id: int,
        stop_ids: set[int],
        temperature: float = 0.0,
        seed: int = 0,
        ignore_eos: bool = False,
        recorder: Recorder | None = None,
        on_block: BlockCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> EngineResult:
        """Decode one request. A `recorder` runs it eagerly and unfolded: one record per round of
        the unfolded schedule (what the trainer replays), at the cost of the commit passes."""
        lay = layout(len(prompt_ids), max_new_tokens, block_size)
        spec = RoundSpec(self.model, rule, temperature, block_size)
        kv = self._arena(lay.max_len)
        res = EngineResult([], "length")
        req = _Request(lay, stop_ids, max_new_tokens, ignore_eos, on_block)
        with torch.inference_mode():
            if lay.first_block:
                self._prefill(prompt_ids[: lay.first_block * block_size], block_size, kv)
                res.prefill_forwards = 1
            block_index = [lay.first_block]
            hook = self._record_hook(recorder, block_index) if recorder else None
            runner, buf, fb = self._runner(spec, hook)
            runner.should_stop = should_stop
            res.mode = runner.name
            fold = self.fold_commits and recorder is None
            check = fold and folds_check(spec)  # post-fill checks ride in the joint passes too
            max_rounds = rule.max_rounds(block_size)
            unsettled = False  # block b-1 awaits its folded check: its tokens are not final yet
            for b in range(lay.first_block, lay.num_blocks):
                block_index[0] = b
                pending = fold and b > lay.first_block  # block b-1 awaits its commit (and check)
                if pending:
                    fb.stash(buf)
                canvas, unresolved = initial_canvas(lay, b, prompt_ids, mask_id, self.device)
                last = b == lay.num_blocks - 1
                buf.load(canvas, unresolved, b * block_size, seed, check and not last)
                kv_len = self._kv_len(b, block_size)
                if pending and _fold(runner, fb, buf, kv, kv_len, res, req, b, unsettled):
                    break  # block b-1 ended the request: block b's round 0 goes unused
                rounds = runner.run_block(buf, kv, kv_len, max_rounds, int(pending))
                if not bool(buf.halt):
                    raise RuntimeError(
                        f"block {b} did not finish in {max_rounds} rounds ({rule.name})"
                    )
                res.denoising_forwards += rounds
                unsettled = check and not last and not bool(buf.done)
                if unsettled:
                    continue  # block b's tokens are final after its folded check
                if _emit(res, req, b, int(buf.step), buf.canvas):
                    break  # the last block's commit pass is skipped: nothing reads its KV
                if not fold:
                    runner.commit(buf, kv, kv_len)
                    res.commit_forwards += 1
        return res

    def _kv_len(self, block: int, block_size: int) -> int | None:
        # On the CPU, attend to the written rows only. On CUDA every mode reads the visible length
        # from the device, so eager and the graph modes run identical kernels (identical tokens).
        return (block + 1) * block_size if self.device.type == "cpu" else None

    @staticmethod
    def _record_hook(recorder: Recorder, block_index: list[int]):
        def hook(r: int, seen: tuple, buf: BlockBuffers) -> None:
            canvas, unresolved, z = seen
            entropy, accepted, edited = (
                buf.entropy.clone(),
                buf.accepted.clone(),
                buf.edited.clone(),
            )
            recorder(
                RoundRecord(block_index[0], r, canvas, unresolved, z, entropy, accepted, edited)
            )

        return hook

    def _prefill(self, tokens: list[int], block_size: int, kv: KVCache) -> None:
        """Clean forward of the full prompt blocks (block-causal); writes their K/V, no logits."""
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(len(tokens), device=self.device)
        kv_len = len(tokens) if self.device.type == "cpu" else None  # CUDA: the Triton kernel
        self.model(ids, AttnContext(positions, block_size, kv, kv_len), compute_logits=False)
