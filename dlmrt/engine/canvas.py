"""CanvasEngine: DiffusionGemma's per-request loop (encoder passes + canvas denoising), eager.

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
from dlmrt.engine.engine import BlockCallback, EngineResult
from dlmrt.errors import GenerationCancelled


class CanvasEngine:
    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.canvas_length: int = model.cfg.canvas_length
        self.vocab: int = model.cfg.vocab_size
        self.embed_dtype = model.embed_table.dtype

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
        self._encode(prompt, 0, cache)
        res = EngineResult([], "length", prefill_forwards=1)
        stops = torch.tensor(stop_ids, dtype=torch.long, device=self.device)
        start = len(prompt)
        for index in range(math.ceil(max_new_tokens / self.canvas_length)):
            tokens, steps = self._denoise(start, settings, noise, index, cache, should_stop)
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
            self._encode(canvas, start, cache)
            res.commit_forwards += 1
            start += self.canvas_length
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
