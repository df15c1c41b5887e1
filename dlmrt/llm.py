"""LLM: the user-facing facade. Checkpoint -> model -> Engine; text in, GenerationOutput out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dlmrt.blocks import layout
from dlmrt.checkpoint import load_checkpoint, resolve_model_path
from dlmrt.config import DTYPES, EngineConfig
from dlmrt.decoding import make_rule
from dlmrt.decoding.entropy_bound_canvas import CanvasSettings
from dlmrt.engine.canvas import CanvasEngine, StaticCanvasEngine
from dlmrt.engine.engine import BlockCallback, Engine, EngineResult, Recorder
from dlmrt.engine.modes import select_mode
from dlmrt.errors import CheckpointError
from dlmrt.models.config import ModelConfig
from dlmrt.models.llada2_config import LLaDA2Config
from dlmrt.outputs import GenerationOutput
from dlmrt.params import DecodeParams
from dlmrt.tokenizer import Tokenizer

log = logging.getLogger("dlmrt")


class LLM:
    """Load a checkpoint once; `generate()` runs one request at a time.

    >>> llm = LLM("/models/QwenDLM-4B-ORL")
    >>> out = llm.generate("Write a prime checker.", max_new_tokens=512)
    >>> out.text, out.tokens_per_forward, out.request_tps
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
    ) -> None:
        if isinstance(dtype, torch.dtype):
            dtype = next((k for k, v in DTYPES.items() if v == dtype), str(dtype))
        self.config = EngineConfig(
            model=None if model is None else str(model),
            dtype=dtype,
            device=None if device is None else str(device),
            role=role,
            mode=mode,
            fold_commits=fold_commits,
            skip_weight_check=skip_weight_check,
        )
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
        self.device, self.dtype = self.config.torch_device(), self.config.torch_dtype()
        check = not self.config.skip_weight_check
        ckpt = load_checkpoint(path, self.dtype, self.device, check_finite=check)
        self.path, self.model, self.model_config = ckpt.path, ckpt.model, ckpt.config
        is_llada = isinstance(self.model_config, LLaDA2Config)
        self.tokenizer = Tokenizer(path)
        self.stop_ids = self.tokenizer.stop_ids
        if not isinstance(self.model_config, ModelConfig):  # DiffusionGemma (LLaDA2Config is one)
            self._init_canvas(path)
            return
        # The tokenizer resolves both from config.json first (already validated by the loader),
        # then from the tokenizer files.
        self.mask_id = self.tokenizer.mask_token_id
        if self.mask_id is None:
            raise CheckpointError(
                f"{path / 'config.json'}: no mask token (set 'mask_token_id' in config.json or a "
                "mask token such as <|MASK|> in the tokenizer)"
            )
        has_adapter = self.model_config.residual is not None
        orl = self.config.role == "orl" or (self.config.role is None and has_adapter)
        self.default_rule = "entropy_budget" if orl else "threshold"
        if is_llada:
            self.default_rule = _llada_rule(path, self.config.role, has_adapter)
        self.mode, self.mode_reason = select_mode(self.config.mode, self.device, is_llada)
        log.info("execution mode %s: %s", self.mode, self.mode_reason)
        self.engine = Engine(
            self.model, self.device, self.dtype, self.mode, self.config.fold_commits
        )
        self.canvas = None
        log.info("default rule %s, block %d", self.default_rule, self.model_config.block_size)

    def generate(
        self,
        prompt: str | list[int],
        *,
        chat: bool = False,
        recorder: Recorder | None = None,
        on_block: BlockCallback | None = None,
        should_stop: Callable[[], bool] | None = None,
        **kwargs: Any,
    ) -> GenerationOutput:
        """Generate for one prompt (text or token ids). Keyword arguments are `DecodeParams` fields.

        chat=True wraps a text prompt as one user message in the checkpoint's chat template.
        `recorder` receives every round's `RoundRecord`; `on_block(index, rounds, tokens)` each block.
        `should_stop()` is polled between rounds (between blocks in block_graph mode); when it returns
        True the request ends with `GenerationCancelled` and the engine is free for the next one.
        """
        params = DecodeParams.from_kwargs(**kwargs)
        t0 = time.perf_counter()
        ids = self._prompt_ids(prompt, chat)
        if self.canvas is not None:
            if recorder is not None:
                raise ValueError("recorder: not supported for canvas (DiffusionGemma) decoding")
            res = self._generate_canvas(ids, params, on_block, should_stop)
            return self._output(ids, res, t0)
        self._check_block_params(params)
        block = params.block_length or self.model_config.block_size
        limit = self.model_config.max_position_embeddings
        total = layout(len(ids), params.max_new_tokens, block).max_len
        if total > limit:
            raise ValueError(
                f"prompt: {len(ids)} prompt tokens + max_new_tokens {params.max_new_tokens} "
                f"(rounded up to {total}, whole blocks of {block}) exceed the model's "
                f"max_position_embeddings {limit}"
            )
        res = self.engine.generate(
            ids,
            rule=make_rule(
                params.rule or ("llada_editing" if params.editing else self.default_rule),
                threshold=params.threshold,
                entropy_budget=params.entropy_budget,
                denoising_steps=params.denoising_steps or block,
                editing=params.editing or "quality",
                max_post_steps=params.max_post_steps,
            ),
            block_size=block,
            max_new_tokens=params.max_new_tokens,
            mask_id=self.mask_id,
            stop_ids=self.stop_ids,
            temperature=params.temperature,
            seed=params.seed or 0,
            ignore_eos=params.ignore_eos,
            recorder=recorder,
            on_block=on_block,
            should_stop=should_stop,
        )
        return self._output(ids, res, t0)

    def _output(self, ids: list[int], res: EngineResult, t0: float) -> GenerationOutput:
        return GenerationOutput(
            text=self.tokenizer.decode(res.token_ids),
            token_ids=res.token_ids,
            finish_reason=res.finish_reason,
            prompt_tokens=len(ids),
            num_denoising_forwards=res.denoising_forwards,
            num_commit_forwards=res.commit_forwards,
            num_prefill_forwards=res.prefill_forwards,
            request_time_s=time.perf_counter() - t0,
            rounds_per_block=res.rounds_per_block,
            mode=res.mode,
        )

    def _check_block_params(self, params: DecodeParams) -> None:
        set_ = [k for k, v in params.canvas_overrides().items() if v is not None]
        if params.rule == "entropy_bound_canvas" or set_ or params.rng is not None:
            what = "rule entropy_bound_canvas" if not set_ else ", ".join(set_)
            raise ValueError(
                f"{what}: canvas-decoder settings apply to DiffusionGemma checkpoints only, "
                f"not {self.model_config.architecture}"
            )

    def _init_canvas(self, path: Path) -> None:
        """DiffusionGemma: the checkpoint's (or role's) canvas settings; mode as QwenDLM's.

        A graph mode (CUDA; auto picks block_graph, else round_graph) runs `StaticCanvasEngine`
        with the counter RNG (the default there); `CanvasEngine`, the reference path, serves
        mode eager and any request with rng="torch" (transformers' draws, not graph-replayable).
        """
        arch, mode = self.model_config.architecture, self.config.mode
        if self.device.type != "cuda" and mode not in ("auto", "eager"):
            raise ValueError(
                f"mode: {mode!r} is not available for {arch} on {self.device} (CUDA graphs need "
                "a CUDA device); use mode='auto' or 'eager'"
            )
        self.mode, self.mode_reason = select_mode(mode, self.device, moe=True)
        log.info("execution mode %s: %s", self.mode, self.mode_reason)
        self.canvas = CanvasEngine(self.model, self.device)
        self.canvas_static = None  # set to a StaticCanvasEngine(..., "eager") to run that path
        if self.mode != "eager":
            self.canvas_static = StaticCanvasEngine(self.model, self.device, self.mode)
        self._torch_rng_logged = False
        self.canvas_settings = CanvasSettings.from_generation_config(path, self.config.role)
        self.default_rule, self.mask_id = "entropy_bound_canvas", None
        log.info("canvas decoding, canvas %d: %s", self.canvas.canvas_length, self.canvas_settings)

    def _generate_canvas(self, ids, params: DecodeParams, on_block, should_stop) -> EngineResult:
        if params.editing is not None:
            raise ValueError(
                "editing: applies to rule 'llada_editing' only, not to canvas decoding"
            )
        if params.rule not in (None, "entropy_bound_canvas"):
            raise ValueError(
                f"rule: {params.rule!r} does not apply to {self.model_config.architecture} "
                "(its decoder is entropy_bound_canvas)"
            )
        if params.temperature or params.block_length not in (None, self.canvas.canvas_length):
            raise ValueError(
                "temperature, block_length: fixed by DiffusionGemma's decoder (use t_min/t_max; "
                f"the canvas length is {self.canvas.canvas_length})"
            )
        images = set(ids) & set(self.model_config.image_token_ids)
        if images:
            raise ValueError(
                f"prompt: holds image token id {min(images)}; dlmrt runs the text tower only "
                "(image inputs are not supported)"
            )
        length = self.canvas.canvas_length
        total = len(ids) + -(-params.max_new_tokens // length) * length
        if total > self.model_config.max_position_embeddings:
            raise ValueError(
                f"prompt: {len(ids)} prompt tokens + max_new_tokens {params.max_new_tokens} "
                f"(rounded up to {total}, whole canvases of {length}) exceed the model's "
                f"max_position_embeddings {self.model_config.max_position_embeddings}"
            )
        overrides = {k: v for k, v in params.canvas_overrides().items() if v is not None}
        return self._canvas_engine(params.rng).generate(
            ids,
            replace(self.canvas_settings, **overrides),
            max_new_tokens=params.max_new_tokens,
            stop_ids=sorted(self.stop_ids),
            seed=params.seed or 0,
            rng=params.rng or ("counter" if self.canvas_static is not None else "torch"),
            ignore_eos=params.ignore_eos,
            on_block=on_block,
            should_stop=should_stop,
        )

    def _canvas_engine(self, rng: str | None) -> CanvasEngine:
        """The static engine unless there is none or the request asks for torch's draws."""
        if self.canvas_static is None:
            return self.canvas
        if rng == "torch":
            if not self._torch_rng_logged:
                log.info(
                    "rng='torch' (transformers' draws) cannot be replayed in a CUDA graph: such "
                    "requests run on the eager reference path (mode 'eager' in their output)"
                )
                self._torch_rng_logged = True
            return self.canvas
        return self.canvas_static

    def _prompt_ids(self, prompt: str | list[int], chat: bool) -> list[int]:
        if isinstance(prompt, str):
            if chat:
                prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(prompt)
        if chat:
            raise ValueError("chat: needs a text prompt, got token ids")
        if not isinstance(prompt, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            raise ValueError("prompt: expected a string or a list of token ids (ints)")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        return list(prompt)


def _llada_rule(path: Path, role: str | None, has_adapter: bool) -> str:
    """LLaDA2 Base and ORL both decode with `llada_editing`; role='orl' needs the ORL adapter."""
    if role == "orl" and not has_adapter:
        raise CheckpointError(
            f"{path / 'config.json'}: role='orl' needs an ORL checkpoint ('orl_residual' in "
            "config.json and model.residual_adapter.* weights); this is a Base LLaDA2 checkpoint"
        )
    return "llada_editing"
