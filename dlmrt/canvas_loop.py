"""The encoder-decoder style's request loop (DiffusionGemma), shared by the engine and the oracle.

encode the prompt -> for each canvas: denoise it (the caller's `denoise`) -> append its argmax
tokens -> stop at a stop id (anywhere in the canvas: the output is cut after the first) or once
max_new_tokens are reached -> encode the canvas (the caller's `commit`, a commit forward) before
the next one. The last canvas is never encoded. Canvases start right after the prompt (no block
alignment), as in transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from dlmrt.outputs import EngineResult, ProgressCallback

Denoise = Callable[[int], tuple[torch.Tensor, int]]  # canvas index -> (argmax [L] on device, steps)
Commit = Callable[[list[int]], None]  # encode the finished canvas before the next one


def canvas_loop(
    denoise: Denoise,
    commit: Commit,
    *,
    canvas_length: int,
    max_new_tokens: int,
    stop_ids: list[int],
    ignore_eos: bool,
    on_progress: ProgressCallback | None,
    mode: str,
) -> EngineResult:
    """Run the canvases of one request; the caller has encoded the prompt."""
    res = EngineResult([], "length", mode=mode)
    stops: torch.Tensor | None = None
    canvas: list[int] = []
    for index in range(math.ceil(max_new_tokens / canvas_length)):
        if index:
            commit(canvas)
            res.commit_forwards += 1
        tokens, steps = denoise(index)
        res.denoising_forwards += steps
        res.rounds_per_block.append(steps)
        canvas = tokens.tolist()
        res.token_ids += canvas
        if stops is None:
            stops = torch.tensor(stop_ids, dtype=torch.long, device=tokens.device)
        if not ignore_eos and stop_ids and bool(torch.isin(tokens, stops).any()):
            first = next(i for i, t in enumerate(canvas) if t in stop_ids)
            del res.token_ids[len(res.token_ids) - len(canvas) + first + 1 :]
            res.finish_reason = "stop"
        if on_progress is not None:
            on_progress(index, steps, res.token_ids[:max_new_tokens])
        if res.finish_reason == "stop" or len(res.token_ids) >= max_new_tokens:
            break
    if len(res.token_ids) > max_new_tokens:
        res.token_ids, res.finish_reason = res.token_ids[:max_new_tokens], "length"
    return res
