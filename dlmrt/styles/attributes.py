"""The attributes `LLM` reads through to its one style (`llm.engine`, `llm.stop_ids`, ...).

A base class of `LLM`: every attribute here names the held `self.style`'s own, so callers (the CLI,
the server, the trainer, tests) keep one spelling whichever style the checkpoint's family picked.
The assignable ones are those tests swap (an engine with other settings, stop ids, a config).
"""

from __future__ import annotations

from typing import Any

from dlmrt.params import DecodeParams


class StyleAttributes:
    """Read-through attributes of `self.style` (and the tensor-parallel `group`)."""

    @property
    def engine(self):
        """The style's engine (`BlockEngine` or `EncoderDecoderEngine`)."""
        return self.style.engine

    @engine.setter
    def engine(self, engine) -> None:  # tests swap in an engine with other settings
        self.style.engine = engine

    @property
    def group(self):
        """The tensor-parallel group (None: one process)."""
        return self._group

    @group.setter
    def group(self, group) -> None:  # tests attach a group to an LLM built around a sharded model
        self._group = group
        if "style" in self.__dict__:
            self.style.tensor_parallel = group is not None

    @property
    def model_config(self):
        """The model's parsed config (the style checks requests against it; assignable)."""
        return self.style.cfg

    @model_config.setter
    def model_config(self, cfg) -> None:
        self.style.cfg = cfg

    @property
    def stop_ids(self) -> set[int]:
        """The token ids that end a request (the style's; assignable)."""
        return self.style.stop_ids

    @stop_ids.setter
    def stop_ids(self, ids: set[int]) -> None:
        self.style.stop_ids = set(ids)

    @property
    def default_rule(self) -> str:
        return self.style.default_rule

    @property
    def mask_id(self) -> int | None:
        """The block style's mask token id (None for the encoder-decoder style)."""
        return self.style.mask_id

    def decoder_of(self, params: DecodeParams | None = None) -> dict[str, Any]:
        """The decoder a request with `params` runs, its knobs resolved (`Style.decoder_of`);
        None: a request that sets nothing, i.e. the checkpoint's defaults."""
        return self.style.decoder_of(params if params is not None else DecodeParams())

    @property
    def decoder(self):
        """The block style's decoder defaults (`DecoderDefaults`; None for encoder-decoder)."""
        return self.style.decoder

    @property
    def canvas_settings(self):
        """The encoder-decoder style's `CanvasSettings` (None for block decoding)."""
        return self.style.canvas_settings
