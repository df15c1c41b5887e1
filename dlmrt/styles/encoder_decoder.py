"""The encoder-decoder style (DiffusionGemma): the prompt encoded once, then canvases of a fixed
length denoised in steps by the checkpoint's canvas decoder (`CanvasSettings`), on
`EncoderDecoderEngine`. Counter noise (the default in a graph mode) runs the static path in the
engine's mode; torch's draws (the default in eager mode: transformers' own noise) run the
reference loop."""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from typing import Any

from dlmrt.config import EAGER
from dlmrt.decoding.entropy_bound_canvas import CanvasSettings
from dlmrt.engine import EncoderDecoderEngine
from dlmrt.outputs import ProgressCallback, TokensCallback
from dlmrt.params import DecodeParams
from dlmrt.rules import ENCODER_DECODER
from dlmrt.structured import constraint_for
from dlmrt.styles.base import Hooks, Setup
from dlmrt.styles.checks import check_encoder_decoder_request, check_rule_style

log = logging.getLogger("dlmrt")


class EncoderDecoderStyle:
    decoder = None  # the block style's (every style answers the same attributes)
    mask_id = None
    live_drafts = False  # a canvas's drafts come from its step records

    def __init__(self, engine: EncoderDecoderEngine, setup: Setup, settings: CanvasSettings):
        self.engine, self.canvas_settings = engine, settings
        self.default_rule = setup.default_rule
        self.cfg, self.stop_ids = setup.model.cfg, setup.stop_ids
        self.mode, self.tensor_parallel = setup.mode, setup.tensor_parallel
        self.tokenizer = setup.tokenizer  # structured output compiles grammars over it

    @classmethod
    def from_checkpoint(cls, setup: Setup) -> EncoderDecoderStyle:
        """The checkpoint's (or its role's) canvas settings and the engine."""
        config = setup.config
        engine = EncoderDecoderEngine(
            setup.model, setup.device, setup.mode, config.kv_cache_dtype, config.prefix_reuse
        )
        settings = CanvasSettings.from_generation_config(
            setup.checkpoint.generation_config, setup.path / "generation_config.json", config.role
        )
        log.info("canvas decoding, canvas %d: %s", engine.canvas_length, settings)
        return cls(engine, setup, settings)

    def check(self, ids: list[int], params: DecodeParams) -> None:
        check_rule_style(params, ENCODER_DECODER, self.cfg.architecture)
        check_encoder_decoder_request(ids, params, self.engine.canvas_length, self.cfg)
        self.rng(params.rng)

    def decoder_of(self, params: DecodeParams) -> dict[str, Any]:
        settings = asdict(self._settings(params))
        return {"rule": params.rule or self.default_rule, **settings, "rng": self.rng(params.rng)}

    def _settings(self, params: DecodeParams) -> CanvasSettings:
        """The checkpoint's canvas settings under the request's own knobs."""
        overrides = {k: v for k, v in params.canvas_overrides().items() if v is not None}
        return replace(self.canvas_settings, **overrides)

    def rows_needed(self, prompt_len: int, max_new_tokens: int, block_length: int | None) -> int:
        """The prompt, then whole canvases for the new tokens."""
        length = self.engine.canvas_length
        return prompt_len + -(-max_new_tokens // length) * length

    def room(self, prompt_len: int, block_length: int | None) -> int:
        length = self.engine.canvas_length
        return (self.cfg.max_position_embeddings - prompt_len) // length * length

    def rng(self, rng: str | None) -> str:
        """Counter noise in the graph modes and under tensor parallelism (torch's multinomial
        draws need the whole vocabulary on one rank), else transformers' torch draws."""
        if rng == "torch" and self.tensor_parallel:
            raise ValueError(
                "rng: 'torch' is not supported under tensor parallelism; use 'counter'"
            )
        return rng or ("counter" if self.mode != EAGER or self.tensor_parallel else "torch")

    def generate(self, ids: list[int], params: DecodeParams, hooks: Hooks):
        return self.engine.generate(
            ids,
            self._settings(params),
            max_new_tokens=params.max_new_tokens,
            stop_ids=sorted(self.stop_ids),
            seed=params.seed or 0,
            rng=self.rng(params.rng),
            ignore_eos=params.ignore_eos,
            on_progress=per_canvas(hooks.on_progress, hooks.on_tokens),
            should_stop=hooks.should_stop,
            recorder=hooks.recorder,
            constraint=self.constraint(params),
        )

    def constraint(self, params: DecodeParams):
        """The request's grammar state (None: unconstrained)."""
        fmt, vocab, budget = params.response_format, self.cfg.vocab_size, params.max_new_tokens
        return constraint_for(
            fmt, self.tokenizer, vocab, self.stop_ids, budget, self.tensor_parallel
        )


def per_canvas(
    on_progress: ProgressCallback | None, on_tokens: TokensCallback | None
) -> ProgressCallback | None:
    """`on_progress`, also handing `on_tokens` the output after each canvas: a canvas's rows are
    final only when the canvas is (every step re-decides every row, nothing is frozen, and the
    output is the last step's argmax: `decoding/entropy_bound_canvas.py`), so this style streams
    by canvases."""
    if on_tokens is None:
        return on_progress

    def both(index: int, steps: int, tokens: list[int]) -> None:
        if on_progress is not None:  # first: a canvas's drafts come before its text
            on_progress(index, steps, tokens)
        on_tokens(list(tokens))

    return both
