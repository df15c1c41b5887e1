"""Decoding styles (`dlmrt/styles/`): each owns its requests; `LLM` holds one and never branches
on which; the server sizes requests by the style's own layout."""

from __future__ import annotations

import inspect
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import write_checkpoint

import dlmrt.llm
from dlmrt import LLM
from dlmrt.styles import BlockStyle, EncoderDecoderStyle


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """A block-style checkpoint (QwenDLM) and an encoder-decoder one (DiffusionGemma)."""
    from dg_helpers import tiny_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("st") / "b"), tiny_checkpoint(tmp_path_factory)[
        0
    ]


@pytest.fixture(scope="module")
def llms(paths):
    return LLM(paths[0], device="cpu"), LLM(paths[1], device="cpu")


@pytest.mark.parametrize("which", [0, 1], ids=["block", "encoder_decoder"])
def test_a_load_reads_each_config_file_once(paths, which, monkeypatch):
    """The loader parses config.json and generation_config.json; the tokenizer and the style
    take them from the `Checkpoint` (`Setup.checkpoint`), and read neither again."""
    reads = Counter()
    read_text = Path.read_text

    def counted(self, *args, **kwargs):
        reads[self.name] += 1
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    LLM(paths[which], device="cpu")
    assert (paths[which] / "generation_config.json").is_file()
    assert (reads["config.json"], reads["generation_config.json"]) == (1, 1)


def test_llm_holds_one_style_and_no_style_branch(llms):
    block, encdec = llms
    assert isinstance(block.style, BlockStyle) and isinstance(encdec.style, EncoderDecoderStyle)
    assert block.engine is block.style.engine and encdec.engine is encdec.style.engine
    assert (block.canvas_settings, encdec.decoder, encdec.mask_id) == (None, None, None)
    source = inspect.getsource(dlmrt.llm)
    assert "style ==" not in source and "BLOCK" not in source


def test_rows_needed_and_room_follow_each_styles_layout(llms):
    block, encdec = llms
    b = block.model_config.block_size
    assert block.style.rows_needed(b + 1, 2 * b, None) == 4 * b  # whole blocks over both
    assert block.style.rows_needed(3, 5, 4) == 8
    length = encdec.engine.canvas_length
    assert encdec.style.rows_needed(3, length + 1, None) == 3 + 2 * length  # prompt, then canvases
    limit = encdec.model_config.max_position_embeddings
    room = encdec.style.room(3, None)
    assert encdec.style.rows_needed(3, room, None) <= limit
    assert encdec.style.rows_needed(3, room + 1, None) > limit


def test_the_server_sizes_an_encoder_decoder_request_by_the_canvas(llms):
    pytest.importorskip("pydantic")  # the server's extra (absent on a bare GPU image)
    from dlmrt.server.protocol import ModelInfo

    _, encdec = llms
    cfg = encdec.model_config
    info = ModelInfo(
        "m", encdec.tokenizer, cfg.vocab_size, None, cfg.max_position_embeddings, style=encdec.style
    )
    length = encdec.engine.canvas_length
    assert info.rows_needed(5, 1, None) == 5 + length
    assert info.room(5, None) == encdec.style.room(5, None)


def test_a_request_error_comes_from_the_style(llms):
    block, encdec = llms
    with pytest.raises(ValueError, match="block_length: .* larger than the checkpoint"):
        block.generate([5, 6], block_length=4 * block.model_config.block_size)
    with pytest.raises(ValueError, match="canvas length is"):
        encdec.generate([5, 6], block_length=encdec.engine.canvas_length + 1)


def test_generate_takes_validated_params_as_they_are(llms):
    from dlmrt.params import DecodeParams

    block, _ = llms
    params = DecodeParams(max_new_tokens=6, ignore_eos=True, rule="threshold", threshold=0.5)
    by_params = block.generate([5, 6, 7], params=params)
    by_kwargs = block.generate(
        [5, 6, 7], max_new_tokens=6, ignore_eos=True, rule="threshold", threshold=0.5
    )
    assert by_params.token_ids == by_kwargs.token_ids and len(by_params.token_ids) == 6
    with pytest.raises(TypeError, match="params or keyword arguments, not both"):
        block.generate([5, 6, 7], params=params, max_new_tokens=3)


def test_decoder_of_resolves_a_requests_knobs_in_either_style(llms):
    """The request's knob, else the checkpoint's default, else dlmrt's; no knob set: the
    defaults the bench report and `dlmrt train eval` record."""
    from dataclasses import asdict

    from dlmrt.params import DecodeParams

    block, encdec = llms
    assert block.decoder_of() == block.decoder_of(DecodeParams())
    defaults = block.decoder_of()
    assert defaults["rule"] == block.default_rule
    assert (defaults["threshold"], defaults["entropy_budget"]) == (
        block.decoder.threshold,
        block.decoder.entropy_budget,
    )
    assert defaults["denoising_steps"] is None  # fixed_steps settles it: the block length
    asked = block.decoder_of(DecodeParams(threshold=0.25, editing="speed"))
    assert (asked["rule"], asked["threshold"], asked["editing"]) == ("llada_editing", 0.25, "speed")

    canvas = encdec.decoder_of()
    assert canvas == {
        "rule": "entropy_bound_canvas",
        **asdict(encdec.canvas_settings),
        "rng": "torch",
    }
    bound = encdec.canvas_settings.entropy_bound * 2
    asked = encdec.decoder_of(DecodeParams(entropy_bound=bound, rng="counter"))
    assert (asked["entropy_bound"], asked["rng"]) == (bound, "counter")
    assert asked["t_max"] == encdec.canvas_settings.t_max


def test_front_ends_ask_the_style_not_whether_it_has_a_decoder():
    """cli, server, llm.py, bench and the trainer's CLI read `decoder_of`, never `llm.decoder`."""
    root = Path(dlmrt.llm.__file__).parent
    fronts = [root / "cli.py", root / "llm.py", root / "train" / "cli.py"]
    fronts += [*(root / "server").rglob("*.py"), *(root / "bench").rglob("*.py")]
    assert all(p.is_file() for p in fronts)
    named = [str(p.relative_to(root)) for p in fronts if re.search(r"\.decoder\b", p.read_text())]
    assert named == []
