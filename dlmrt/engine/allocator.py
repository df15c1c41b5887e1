"""The CUDA caching allocator's one setting the engine changes: expandable segments.

A request's transient tensors come in many large sizes (prefill chunks, the round's vocabulary
passes, the captured graphs' pool); with fixed-size segments the allocator keeps a segment per
size it has seen, so memory *reserved* runs far above memory *allocated*. Measured on an H200
(QwenDLM-4B shape, 8k-token prompt, block_graph, `benchmarks/rounds/request_overhead.py`): 0.36 GiB
allocated but 1.26 GiB reserved beyond weights + KV arena with fixed segments, 0.27 / 0.62 GiB with
expandable ones (segments grow in place by mapping more pages), tokens unchanged. vLLM and
SGLang users get the same by exporting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; the engine
switches it on itself, once, unless the user has set an allocator configuration
(PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF or PYTORCH_HIP_ALLOC_CONF: their choice wins). It
applies to segments allocated from then on; a torch that refuses it is logged, not fatal.
"""

from __future__ import annotations

import logging
import os
import warnings

import torch

log = logging.getLogger("dlmrt")
_done = False
USER_SETTINGS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def use_expandable_segments(device: torch.device | str) -> bool:
    """Switch the allocator to expandable segments for CUDA `device` (once per process); False
    when not CUDA, when the user configured the allocator (`USER_SETTINGS`), or when this torch
    cannot."""
    global _done
    if torch.device(device).type != "cuda" or any(v in os.environ for v in USER_SETTINGS):
        return False
    if not _done:
        setter = _setter()
        try:
            if setter is None:
                raise RuntimeError("no runtime allocator-settings call in this torch")
            setter("expandable_segments:True")
        except RuntimeError as exc:
            log.info("allocator: expandable segments not switched on (%s); left as is", exc)
            return False
        log.info("allocator: expandable segments on (no allocator configuration set)")
        _done = True
    return True


def _setter():
    """torch's runtime allocator-settings call: the CUDA one (the one measured on the H200 with
    torch 2.11, which deprecates it with a FutureWarning: silenced), else the accelerator one
    that replaces it, else None."""
    cuda = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if cuda is None:
        return getattr(torch._C, "_accelerator_setAllocatorSettings", None)

    def quiet(settings: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            cuda(settings)

    return quiet
