"""LLM: the user-facing facade. Checkpoint -> model -> one engine; text in, GenerationOutput out.

The model's family (`dlmrt/models/__init__.py`) decides everything family-specific: the engine
(block style: `BlockEngine`; encoder-decoder style: `EncoderDecoderEngine`), whether graph modes
need the Triton MoE kernels, and the default rule. `LLM` holds exactly one engine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dlmrt import models
from dlmrt.checkpoint import load_checkpoint, resolve_model_path
from dlmrt.config import EngineConfig, torch_dtypes
from dlmrt.decoder_defaults import DecoderDefaults
from dlmrt.decoding import make_rule
from dlmrt.decoding.entropy_bound_canvas import CanvasSettings
from dlmrt.distributed import requests as tp_requests
from dlmrt.distributed import setup as tp_setup
from dlmrt.draft_stream import DraftStream
from dlmrt.drafts import DraftBuilder, DraftCallback, chain
from dlmrt.engine import BlockEngine, EncoderDecoderEngine, select_mode
from dlmrt.errors import CheckpointError
from dlmrt.outputs import BlockCallback, CanvasRecorder, GenerationOutput, Recorder, StopCheck
from dlmrt.params import DecodeParams
from dlmrt.quant.config import kv_cache_dtype_for
from dlmrt.request_checks import (
    check_block_length,
    check_callbacks,
    check_canvas_request,
    check_not_empty,
    check_rule_style,
    prompt_ids,
)
from dlmrt.rules import BLOCK
from dlmrt.tokenizer import Tokenizer

log = logging.getLogger("dlmrt")


class LLM:
    """Load a checkpoint once; `generate()` runs one request at a time.

    >>> llm = LLM("/models/QwenDLM-4B-ORL")
    >>> out = llm.generate("Write a prime checker.", max_new_tokens=512)
    >>> out.text, out.tokens_per_forward, out.request_tps

    quantization="fp8" quantizes the linear weights to FP8 at load; an FP8 checkpoint is detected
    from its config (docs/quantization.md); kv_cache_dtype="fp8" gives an FP8 KV arena;
    activations="nvfp4" emulates W4A4 on an NVFP4 checkpoint's MLPs (numerics, not speed).
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
        )
        config, self.group = tp_setup.join(config)  # torchrun: this rank's device, the group
        if model is None:
            from dlmrt.demo import demo_model_path

            path = demo_model_path()
            log.warning(
                "no model given: using the embedded demo model at %s (a 4.85M-parameter model "
                "that only solves short arithmetic word problems)",
                path,
            )
        else:
            path = resolve_model_path(str(model))
        check = not config.skip_weight_check
        ckpt = load_checkpoint(
            path, config.torch_dtype(), config.torch_device(), check_finite=check,
            quantization=config.quantization, shard=tp_setup.loader(self.group),
            activations=config.activations,
        )  # fmt: skip
        self._setup(ckpt.model, Tokenizer(path), ckpt.path, config)
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
        mode: str = "eager",
        fold_commits: bool = True,
    ) -> LLM:
        """An `LLM` around a live model (its current weights, device and dtype), e.g. the
        trainer's; path: its directory (whose generation_config.json applies). mode: "eager" by
        default; graph modes capture the weights' storage, so a graph mode stays correct only
        while the weights are updated in place."""
        param = next(model.parameters())
        dtype = next((k for k, v in torch_dtypes().items() if v == param.dtype), None)
        config = EngineConfig(
            model=str(path), dtype=dtype, device=str(param.device), role=role, mode=mode,
            fold_commits=fold_commits,
        )  # fmt: skip
        llm = cls.__new__(cls)
        llm.group = None
        llm._setup(model, tokenizer, Path(path), config)
        return llm

    def _setup(self, model, tokenizer: Tokenizer, path: Path, config: EngineConfig) -> None:
        self.config, self.path, self.model, self.model_config = config, path, model, model.cfg
        self.device, self.dtype = config.torch_device(), next(model.parameters()).dtype
        self.family = models.family_of(model)
        self.tokenizer = tokenizer
        # declared stop ids, else the family's reading of config.json (LLaDA2: the pad id), else
        # the tokenizer's eos token
        family_stops = set(getattr(model.cfg, "eos_token_ids", ()) or ())
        self.stop_ids = tokenizer.declared_stop_ids or family_stops or tokenizer.stop_ids
        has_adapter = getattr(model, "adapter", None) is not None
        try:
            self.default_rule = self.family.default_rule(config.role, has_adapter)
            auto_rule = self.family.default_rule(None, has_adapter)  # the rule without a role
        except ValueError as e:
            raise CheckpointError(f"{path / 'config.json'}: {e}") from None
        self.mode, self.mode_reason = tp_setup.agree_mode(
            *select_mode(config.mode, self.device, self.family.moe), self.group
        )
        log.info("execution mode %s: %s", self.mode, self.mode_reason)
        if self.family.style == BLOCK:
            self._setup_blocks(path, auto_rule)
        else:
            self._setup_canvases(path)

    def _setup_blocks(self, path: Path, auto_rule: str) -> None:
        # config.json's (validated by the loader) or the family's default (LLaDA2: 156895), else
        # the tokenizer's mask token
        self.mask_id = getattr(self.model_config, "mask_token_id", None)
        if self.mask_id is None:
            self.mask_id = self.tokenizer.mask_token_id
        if self.mask_id is None:
            raise CheckpointError(
                f"{path / 'config.json'}: no mask token (set 'mask_token_id' in config.json or a "
                "mask token such as <|MASK|> in the tokenizer)"
            )
        self.canvas_settings = (
            None  # the encoder-decoder style's (same attributes for every family)
        )
        self.decoder = DecoderDefaults.of_checkpoint(path, self.default_rule, auto_rule)
        self.default_rule = self.decoder.rule
        mode, fold = self.mode, self.config.fold_commits
        kv = kv_cache_dtype_for(self.config.kv_cache_dtype, path)  # the checkpoint may declare fp8
        self.engine = BlockEngine(self.model, self.device, self.dtype, mode, fold, kv)
        log.info("default decoder %s, block %d", self.decoder, self.model_config.block_size)

    def _setup_canvases(self, path: Path) -> None:
        """DiffusionGemma: the checkpoint's (or role's) canvas settings. Counter noise (the
        default in a graph mode) runs the static path in the engine's mode; torch's draws (the
        default in eager mode: transformers' own noise) run the reference loop."""
        self.mask_id = None
        self.decoder = None  # the block style's (same attributes for every family)
        kv = kv_cache_dtype_for(self.config.kv_cache_dtype, path)  # the checkpoint may declare fp8
        self.engine = EncoderDecoderEngine(self.model, self.device, self.mode, kv)
        self.canvas_settings = CanvasSettings.from_generation_config(path, self.config.role)
        length = self.engine.canvas_length
        log.info("canvas decoding, canvas %d: %s", length, self.canvas_settings)

    def generate(
        self,
        prompt: str | list[int],
        *,
        chat: bool = False,
        recorder: Recorder | CanvasRecorder | None = None,
        on_block: BlockCallback | None = None,
        should_stop: StopCheck | None = None,
        on_round: DraftCallback | None = None,
        **kwargs: Any,
    ) -> GenerationOutput:
        """Generate for one prompt (text or token ids). Keyword arguments are `DecodeParams` fields.

        chat=True wraps a text prompt as one user message in the checkpoint's chat template.
        `recorder` receives every round's `RoundRecord` (canvas style: every step's
        `CanvasStepRecord`), after its block, in any mode; `on_block(index, rounds, tokens)` each
        block; `on_round(draft)` every round's `Draft` (`dlmrt/drafts.py`, `docs/drafts.md`), a
        block at a time, before that block's `on_block`. A block-style request with a recorder
        (or drafts) runs unfolded: its records follow the unfolded rounds.
        `should_stop()` is polled between rounds (between blocks in block_graph mode); when it returns
        True the request ends with `GenerationCancelled` and the engine is free for the next one.
        Tensor parallel: every rank calls this; rank 0's arguments decide (`dlmrt/distributed/`).
        """
        if self.group is not None:
            if recorder is not None or on_round is not None:  # rank-0 callbacks, not mirrored
                raise ValueError("recorder / on_round: not supported under tensor parallelism")
            prompt, chat, kwargs, should_stop = tp_requests.share_call(
                self.group, prompt, chat, kwargs, should_stop
            )
        check_callbacks(chat, recorder, on_block, should_stop, on_round)
        if on_round is not None:
            builder = DraftBuilder(on_round, on_block)
            recorder, on_block = chain(recorder, builder.record), builder.on_block
        return self._generate(prompt, chat, recorder, on_block, should_stop, kwargs)

    def follow(self) -> None:
        """Tensor parallel, ranks > 0 of a server: decode what rank 0's `generate` calls share,
        until rank 0 calls `release_followers()`."""

        def run(req):
            prompt, chat, kwargs, poll = tp_requests.unpack(self.group, req)
            return self._generate(prompt, chat, None, None, poll, kwargs)

        tp_requests.follow(self.group, run)

    def release_followers(self) -> None:
        """Rank 0: end the other ranks' `follow` (a no-op without tensor parallelism)."""
        if self.group is not None:
            tp_requests.stop(self.group)

    def _generate(self, prompt, chat, recorder, on_block, should_stop, kwargs) -> GenerationOutput:
        params = DecodeParams.from_kwargs(**kwargs)
        t0 = time.perf_counter()
        ids = prompt_ids(self.tokenizer, prompt, chat, self.model_config.vocab_size)
        check_not_empty(ids, prompt)
        arch = self.model_config.architecture
        check_rule_style(params, self.family.style, arch)
        if self.family.style == BLOCK:
            res = self._generate_blocks(ids, params, recorder, on_block, should_stop)
        else:
            res = self._generate_canvases(ids, params, recorder, on_block, should_stop)
        return GenerationOutput.of(self.tokenizer.decode(res.token_ids), len(ids), res, t0)

    def stream(self, prompt: str | list[int], *, chat: bool = False, **kwargs: Any) -> DraftStream:
        """Iterate the request's `Draft`s (a block at a time); afterwards `.output` holds its
        `GenerationOutput`. Leaving early (`close()`, a `with` block) cancels the request."""
        return DraftStream(self.generate, prompt, dict(chat=chat, **kwargs))

    def _generate_blocks(self, ids, params: DecodeParams, recorder, on_block, should_stop):
        block = params.block_length or self.model_config.block_size
        cfg = self.model_config
        check_block_length(len(ids), params, block, cfg.max_position_embeddings, cfg.block_size)
        name, tau, gamma = self.decoder.resolve(params)  # the request's knobs, else the defaults
        rule = make_rule(
            name, threshold=tau, entropy_budget=gamma, denoising_steps=params.denoising_steps or block,
            editing=params.editing or "quality", max_post_steps=params.max_post_steps,
        )  # fmt: skip
        return self.engine.generate(
            ids, rule=rule, block_length=block, max_new_tokens=params.max_new_tokens,
            mask_id=self.mask_id, stop_ids=self.stop_ids, temperature=params.temperature,
            seed=params.seed or 0, ignore_eos=params.ignore_eos, recorder=recorder,
            on_block=on_block, should_stop=should_stop,
        )  # fmt: skip

    def _generate_canvases(self, ids, params: DecodeParams, recorder, on_block, should_stop):
        check_canvas_request(ids, params, self.engine.canvas_length, self.model_config)
        overrides = {k: v for k, v in params.canvas_overrides().items() if v is not None}
        return self.engine.generate(
            ids, replace(self.canvas_settings, **overrides), max_new_tokens=params.max_new_tokens,
            stop_ids=sorted(self.stop_ids), seed=params.seed or 0,
            rng=self._canvas_rng(params.rng),
            ignore_eos=params.ignore_eos, on_block=on_block, should_stop=should_stop,
            recorder=recorder,
        )  # fmt: skip

    def _canvas_rng(self, rng: str | None) -> str:
        """Counter noise in the graph modes and under tensor parallelism (torch's multinomial
        draws need the whole vocabulary on one rank), else transformers' torch draws."""
        if rng == "torch" and self.group is not None:
            raise ValueError(
                "rng: 'torch' is not supported under tensor parallelism; use 'counter'"
            )
        return rng or ("counter" if self.mode != "eager" or self.group is not None else "torch")
