"""The block style (QwenDLM, LLaDA2): a request is blocks of B rows, each denoised in rounds by
the request's acceptance rule (`dlmrt/decoding/`), on `BlockEngine`."""

from __future__ import annotations

import logging
from typing import Any

from dlmrt.blocks import layout, room
from dlmrt.decoding import make_rule
from dlmrt.engine import BlockEngine
from dlmrt.errors import CheckpointError
from dlmrt.params import DecodeParams
from dlmrt.rules import BLOCK
from dlmrt.structured import constraint_for
from dlmrt.styles.base import Hooks, Setup
from dlmrt.styles.checks import check_block_length, check_rule_style
from dlmrt.styles.decoder_defaults import DecoderDefaults

log = logging.getLogger("dlmrt")


class BlockStyle:
    canvas_settings = None  # the encoder-decoder style's (every style answers the same attributes)

    def __init__(self, engine: BlockEngine, setup: Setup, decoder: DecoderDefaults, mask_id: int):
        self.engine, self.decoder, self.mask_id = engine, decoder, mask_id
        self.default_rule = decoder.rule
        self.cfg, self.stop_ids = setup.model.cfg, setup.stop_ids
        self.tokenizer = setup.tokenizer  # structured output compiles grammars over it
        self.tensor_parallel = setup.tensor_parallel

    @property
    def live_drafts(self) -> bool:
        """Drafts come live from the round stream, unless rounds are not streamed."""
        return self.engine.stream_rounds

    @classmethod
    def from_checkpoint(cls, setup: Setup) -> BlockStyle:
        """The mask token (config.json's, validated by the loader, or the family's default, else
        the tokenizer's), the checkpoint's decoder defaults and the engine."""
        cfg, path = setup.model.cfg, setup.path
        mask_id = getattr(cfg, "mask_token_id", None)
        if mask_id is None:
            mask_id = setup.tokenizer.mask_token_id
        if mask_id is None:
            raise CheckpointError(
                f"{path / 'config.json'}: no mask token (set 'mask_token_id' in config.json or a "
                "mask token such as <|MASK|> in the tokenizer)"
            )
        decoder = DecoderDefaults.read(
            setup.default_rule,
            setup.checkpoint.generation_config,
            path / "generation_config.json",
            use_entry=setup.default_rule == setup.auto_rule,
        )
        config = setup.config
        engine = BlockEngine(
            setup.model,
            setup.device,
            setup.dtype,
            setup.mode,
            config.fold_commits,
            config.kv_cache_dtype,
            config.prefix_reuse,
            config.stream_rounds,
        )
        log.info("default decoder %s, block %d", decoder, cfg.block_size)
        return cls(engine, setup, decoder, mask_id)

    def _block(self, block_length: int | None) -> int:
        return block_length or self.cfg.block_size

    def check(self, ids: list[int], params: DecodeParams) -> None:
        cfg = self.cfg
        check_rule_style(params, BLOCK, cfg.architecture)
        check_block_length(
            len(ids),
            params,
            self._block(params.block_length),
            cfg.max_position_embeddings,
            cfg.block_size,
        )

    def decoder_of(self, params: DecodeParams) -> dict[str, Any]:
        name, knobs = self.decoder.rule_knobs(params)
        return {"rule": name, **knobs}

    def rows_needed(self, prompt_len: int, max_new_tokens: int, block_length: int | None) -> int:
        """Whole blocks over prompt + new tokens (the last block is decoded whole)."""
        return layout(prompt_len, max_new_tokens, self._block(block_length)).max_len

    def room(self, prompt_len: int, block_length: int | None) -> int:
        return room(self.cfg.max_position_embeddings, prompt_len, self._block(block_length))

    def generate(self, ids: list[int], params: DecodeParams, hooks: Hooks):
        name, knobs = self.decoder.rule_knobs(params)  # the request's knobs, else the defaults
        block = self._block(params.block_length)
        knobs["denoising_steps"] = knobs["denoising_steps"] or block  # fixed_steps: B by default
        rule = make_rule(name, **knobs)
        return self.engine.generate(
            ids,
            rule=rule,
            block_length=block,
            max_new_tokens=params.max_new_tokens,
            mask_id=self.mask_id,
            stop_ids=self.stop_ids,
            temperature=params.temperature,
            seed=params.seed or 0,
            ignore_eos=params.ignore_eos,
            recorder=hooks.recorder,
            on_progress=hooks.on_progress,
            should_stop=hooks.should_stop,
            constraint=self.constraint(params),
            on_tokens=hooks.on_tokens,
            on_view=hooks.on_view,
        )

    def constraint(self, params: DecodeParams):
        """The request's grammar state (None: unconstrained)."""
        fmt, vocab, budget = params.response_format, self.cfg.vocab_size, params.max_new_tokens
        return constraint_for(
            fmt, self.tokenizer, vocab, self.stop_ids, budget, self.tensor_parallel
        )
