"""The block style (QwenDLM, LLaDA2): a request is blocks of B rows, each denoised in rounds by
the request's acceptance rule (`dlmrt/decoding/`), on `BlockEngine`."""

from __future__ import annotations

import logging

from dlmrt.blocks import layout, room
from dlmrt.decoder_defaults import DecoderDefaults
from dlmrt.decoding import make_rule
from dlmrt.engine import BlockEngine
from dlmrt.errors import CheckpointError
from dlmrt.loading.quant_config import kv_cache_dtype_for
from dlmrt.params import DecodeParams
from dlmrt.request_checks import check_block_length
from dlmrt.structured import parse
from dlmrt.styles.base import Hooks, Setup

log = logging.getLogger("dlmrt")


class BlockStyle:
    canvas_settings = None  # the encoder-decoder style's (every style answers the same attributes)

    def __init__(self, engine: BlockEngine, setup: Setup, decoder: DecoderDefaults, mask_id: int):
        self.engine, self.decoder, self.mask_id = engine, decoder, mask_id
        self.default_rule = decoder.rule
        self.cfg, self.stop_ids = setup.model.cfg, setup.stop_ids
        self.tokenizer = setup.tokenizer  # structured output compiles grammars over it

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
        decoder = DecoderDefaults.of_checkpoint(path, setup.default_rule, setup.auto_rule)
        kv = kv_cache_dtype_for(setup.config.kv_cache_dtype, path)  # the checkpoint may say fp8
        engine = BlockEngine(
            setup.model, setup.device, setup.dtype, setup.mode, setup.config.fold_commits, kv
        )
        log.info("default decoder %s, block %d", decoder, cfg.block_size)
        return cls(engine, setup, decoder, mask_id)

    def _block(self, block_length: int | None) -> int:
        return block_length or self.cfg.block_size

    def check(self, ids: list[int], params: DecodeParams) -> None:
        cfg = self.cfg
        check_block_length(
            len(ids),
            params,
            self._block(params.block_length),
            cfg.max_position_embeddings,
            cfg.block_size,
        )

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
        )

    def constraint(self, params: DecodeParams):
        """The request's grammar state (None: unconstrained); ValueErrors name what is wrong."""
        fmt = parse(params.response_format)
        if fmt is None:
            return None
        from dlmrt.structured.grammar import grammars_for  # needs the `structured` extra

        grammars = grammars_for(self.tokenizer, self.cfg.vocab_size, self.stop_ids)
        return grammars.constraint(fmt, params.max_new_tokens)
