"""LLM: the user-facing facade. Checkpoint -> model -> one engine; text in, GenerationOutput out.

The model's family (`dlmrt/models/__init__.py`) decides everything family-specific: its decoding
style (`dlmrt/styles/`: block or encoder-decoder, each owning its engine, defaults, checks and
requests), whether graph modes need the Triton MoE kernels, and the default rule. `LLM` holds
exactly one style, and never branches on which.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch

from dlmrt import models
from dlmrt.config import EAGER, EngineConfig, torch_dtypes
from dlmrt.distributed import requests as tp_requests
from dlmrt.distributed import setup as tp_setup
from dlmrt.draft_stream import DraftStream
from dlmrt.drafts import DraftBuilder, DraftCallback, chain
from dlmrt.engine import select_mode
from dlmrt.errors import CheckpointError
from dlmrt.loading.checkpoint import Checkpoint, load_checkpoint, resolve_model_path
from dlmrt.outputs import (
    CanvasRecorder,
    GenerationOutput,
    ProgressCallback,
    Recorder,
    StopCheck,
    TokensCallback,
)
from dlmrt.params import DecodeParams
from dlmrt.request_checks import (
    check_callbacks,
    check_not_empty,
    prompt_ids,
    renamed_on_block,
)
from dlmrt.styles import Hooks, Setup, style_for
from dlmrt.styles.attributes import StyleAttributes
from dlmrt.tokenizer import Tokenizer

log = logging.getLogger("dlmrt")


class LLM(StyleAttributes):
    """Load a checkpoint once; `generate()` runs one request at a time.

    >>> llm = LLM("/models/QwenDLM-4B-ORL")
    >>> out = llm.generate("Write a prime checker.", max_new_tokens=512)
    >>> out.text, out.tokens_per_forward, out.request_tps

    quantization="fp8" quantizes the linear weights to FP8 at load; an FP8 checkpoint is detected
    from its config (docs/quantization.md); kv_cache_dtype="fp8" gives an FP8 KV arena;
    activations="nvfp4" emulates W4A4 on an NVFP4 checkpoint's MLPs (numerics, not speed);
    prefer="memory" keeps an NVFP4 checkpoint 4-bit on the GPU (W4A16) instead of its fastest form.
    prefix_reuse=True (the default) lets a request reuse the K/V of the prompt it shares with
    earlier requests (whole blocks; DiffusionGemma: to the token) (`docs/prefix-reuse.md`;
    `out.num_cached_tokens` counts them). stream_rounds=True (the default) hands a request's
    `on_tokens` its tokens every round as they become final, also from inside the block graph
    (`docs/streaming.md`); False: once per block.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        role: str | None = None,
        mode: str = "auto",
        fold_commits: bool = True,
        skip_weight_check: bool = False,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        tensor_parallel_size: int | None = None,
        activations: str = "none",
        prefix_reuse: bool = True,
        prefer: str = "speed",
        stream_rounds: bool = True,
    ) -> None:
        if isinstance(dtype, torch.dtype):
            dtype = next((k for k, v in torch_dtypes().items() if v == dtype), str(dtype))
        config = EngineConfig(
            model=None if model is None else str(model),
            dtype=dtype,
            device=None if device is None else str(device),
            role=role,
            mode=mode,
            fold_commits=fold_commits,
            skip_weight_check=skip_weight_check,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            tensor_parallel_size=tensor_parallel_size,
            activations=activations,
            prefix_reuse=prefix_reuse,
            prefer=prefer,
            stream_rounds=stream_rounds,
        )
        config, self.group = tp_setup.join(config)  # torchrun: this rank's device, the group
        path = _model_path(model)
        how = dict(quantization=config.quantization, activations=config.activations)
        ckpt = load_checkpoint(
            path,
            config.torch_dtype(),
            config.torch_device(),
            check_finite=not config.skip_weight_check,
            shard=tp_setup.loader(self.group),
            prefer=config.prefer,
            **how,
        )
        tokenizer = Tokenizer(path, ckpt.config_json, ckpt.generation_config)
        self._setup(ckpt, tokenizer, config)
        if model is None and self.device.type == "cuda":
            from dlmrt.demo import log_demo_speed

            log_demo_speed(self)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        *,
        path: str | Path,
        role: str | None = None,
        mode: str = EAGER,
        fold_commits: bool = True,
        prefix_reuse: bool = False,
        stream_rounds: bool = True,
    ) -> LLM:
        """An `LLM` around a live model (its current weights, device and dtype), e.g. the
        trainer's; path: its directory (whose generation_config.json applies). mode: "eager" by
        default; graph modes capture the weights' storage, so a graph mode stays correct only
        while the weights are updated in place. prefix_reuse: off by default, as a trained
        model's weights change between requests and kept K/V would go stale
        (`docs/prefix-reuse.md`). stream_rounds: as `LLM`'s."""
        param = next(model.parameters())
        dtype = next((k for k, v in torch_dtypes().items() if v == param.dtype), None)
        config = EngineConfig(
            model=str(path),
            dtype=dtype,
            device=str(param.device),
            role=role,
            mode=mode,
            fold_commits=fold_commits,
            prefix_reuse=prefix_reuse,
            stream_rounds=stream_rounds,
        )
        llm = cls.__new__(cls)
        llm.group = None
        llm._setup(Checkpoint.of_model(model, Path(path)), tokenizer, config)
        return llm

    def _setup(self, ckpt: Checkpoint, tokenizer: Tokenizer, config: EngineConfig) -> None:
        model, path = ckpt.model, ckpt.path
        self.config, self.path, self.model = config, path, model
        self.device, self.dtype = config.torch_device(), next(model.parameters()).dtype
        self.family = models.family_of(model)
        self.tokenizer = tokenizer
        # declared stop ids, else the family's reading of config.json (LLaDA2: the pad id), else
        # the tokenizer's eos token
        family_stops = set(getattr(model.cfg, "eos_token_ids", ()) or ())
        stop_ids = tokenizer.declared_stop_ids or family_stops or tokenizer.stop_ids
        has_adapter = getattr(model, "adapter", None) is not None
        try:
            default_rule = self.family.default_rule(config.role, has_adapter)
            auto_rule = self.family.default_rule(None, has_adapter)  # the rule without a role
        except ValueError as e:
            raise CheckpointError(f"{path / 'config.json'}: {e}") from None
        self.mode, self.mode_reason = tp_setup.agree_mode(
            *select_mode(config.mode, self.device, self.family.moe), self.group
        )
        log.info("execution mode %s: %s", self.mode, self.mode_reason)
        setup = Setup(
            ckpt,
            tokenizer,
            config,
            self.mode,
            self.device,
            self.dtype,
            set(stop_ids),
            default_rule,
            auto_rule,
            self.group is not None,
        )
        self.style = style_for(self.family.style).from_checkpoint(setup)

    def generate(
        self,
        prompt: str | list[int],
        *,
        chat: bool = False,
        recorder: Recorder | CanvasRecorder | None = None,
        on_progress: ProgressCallback | None = None,
        should_stop: StopCheck | None = None,
        on_round: DraftCallback | None = None,
        on_tokens: TokensCallback | None = None,
        params: DecodeParams | None = None,
        **kwargs: Any,
    ) -> GenerationOutput:
        """Generate for one prompt (text or token ids). Keyword arguments are `DecodeParams` fields;
        or pass validated `params` (a `DecodeParams`) instead of them.

        chat=True wraps a text prompt as one user message in the checkpoint's chat template.
        `recorder` receives every round's `RoundRecord` (encoder-decoder style: every step's
        `CanvasStepRecord`), after its block, in any mode; `on_progress(index, rounds, tokens)` after
        each block (encoder-decoder: each canvas, with its steps; `on_block` is its deprecated
        former name); `on_round(draft)` every round's `Draft` (`dlmrt/drafts.py`, `docs/drafts.md`), a
        block at a time, before that block's `on_progress`; `on_tokens(tokens)` the output so far
        each time it grows, as its rows become final: every round for the block style (also in
        block_graph, from inside the graph: `docs/streaming.md`), every canvas for the
        encoder-decoder style; nothing it was given is ever retracted, and its last call equals
        the output's token ids. A block-style request with a recorder
        (or drafts) runs unfolded: its records follow the unfolded rounds.
        `should_stop()` is polled between rounds (between blocks in block_graph mode); when it returns
        True the request ends with `GenerationCancelled` and the engine is free for the next one.
        Tensor parallel: every rank calls this; rank 0's arguments decide (`dlmrt/distributed/`).
        """
        on_progress = renamed_on_block(kwargs, on_progress)
        if params is not None and kwargs:
            raise TypeError(
                f"generate: pass params or keyword arguments, not both ({sorted(kwargs)})"
            )
        if self.group is not None:
            if recorder is not None or on_round is not None:  # rank-0 callbacks, not mirrored
                raise ValueError("recorder / on_round: not supported under tensor parallelism")
            kwargs = dataclasses.asdict(params) if params is not None else kwargs  # broadcast
            prompt, chat, kwargs, should_stop = tp_requests.share_call(
                self.group, prompt, chat, kwargs, should_stop
            )
            params = None
        check_callbacks(chat, recorder, on_progress, should_stop, on_round, on_tokens)
        on_view = None
        if on_round is not None:
            builder = DraftBuilder(on_round, on_progress)
            on_progress = builder.on_progress
            if recorder is None and self.style.live_drafts:  # live, from the round stream
                on_view = builder.view
            else:  # from the records, a block at a time
                recorder = chain(recorder, builder.record)
        params = params if params is not None else DecodeParams.from_kwargs(**kwargs)
        hooks = Hooks(recorder, on_progress, should_stop, on_tokens, on_view)
        return self._generate(prompt, chat, hooks, params)

    def follow(self) -> None:
        """Tensor parallel, ranks > 0 of a server: decode what rank 0's `generate` calls share,
        until rank 0 calls `release_followers()`."""

        def run(req):
            prompt, chat, kwargs, poll = tp_requests.unpack(self.group, req)
            return self._generate(
                prompt, chat, Hooks(should_stop=poll), DecodeParams.from_kwargs(**kwargs)
            )

        tp_requests.follow(self.group, run)

    def release_followers(self) -> None:
        """Rank 0: end the other ranks' `follow` (a no-op without tensor parallelism)."""
        if self.group is not None:
            tp_requests.stop(self.group)

    def _generate(self, prompt, chat, hooks: Hooks, params: DecodeParams) -> GenerationOutput:
        t0 = time.perf_counter()
        ids = prompt_ids(self.tokenizer, prompt, chat, self.model_config.vocab_size)
        check_not_empty(ids, prompt)
        self.style.check(ids, params)
        res = self.style.generate(ids, params, hooks)
        return GenerationOutput.of(self.tokenizer.decode(res.token_ids), len(ids), res, t0)

    def stream(self, prompt: str | list[int], *, chat: bool = False, **kwargs: Any) -> DraftStream:
        """Iterate the request's `Draft`s (a block at a time); afterwards `.output` holds its
        `GenerationOutput`. Leaving early (`close()`, a `with` block) cancels the request."""
        return DraftStream(self.generate, prompt, dict(chat=chat, **kwargs))


def _model_path(model: str | Path | None) -> Path:
    """The checkpoint directory of `model` (a path or a hub-cache name); None: the embedded demo."""
    if model is not None:
        return resolve_model_path(str(model))
    from dlmrt.demo import demo_model_path

    path = demo_model_path()
    log.warning(
        "no model given: using the embedded demo model at %s (a 4.85M-parameter model "
        "that only solves short arithmetic word problems)",
        path,
    )
    return path
