"""DiffusionGemma test helpers shared by the model, decoding, engine and server tests: a tiny
transformers config, its randomisation, a saved checkpoint with the test stop ids, the decoder
settings the tests sweep. (tests/ is on sys.path through its conftest.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import _byte_tokenizer

dg = pytest.importorskip("transformers.models.diffusion_gemma")

STOPS = (1, 5)
VOCAB, WINDOW, CANVAS = 96, 5, 8
S, F_ = "sliding_attention", "full_attention"

# a mid-size text tower (widths past the kernels' smallest tiles): the GPU tests' second size
MID = dict(
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    global_head_dim=64,
    sliding_window=16,
    num_experts=8,
    moe_intermediate_size=128,
    max_position_embeddings=1024,
)


def _config(**text_overrides):
    text = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        global_head_dim=16,
        num_global_key_value_heads=1,
        sliding_window=WINDOW,
        layer_types=[S, S, F_, S, F_],
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=12,
        max_position_embeddings=256,
        initializer_range=0.3,
        use_bidirectional_attention="vision",
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 10000.0},
            F_: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1e4},
        },
    )
    text.update(text_overrides)
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
    )
    return dg.DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS)


def _randomise(model, seed: int) -> None:
    """Non-trivial norms, router scales and (distinct encoder/decoder) layer scalars."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "scale", "per_expert_scale", "layernorm_1.weight")):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))


def tiny_checkpoint(tmp_path_factory) -> tuple[Path, object]:
    """A saved tiny DiffusionGemma (test stop ids, byte tokenizer) and its transformers model."""
    torch.manual_seed(0)
    hf = dg.DiffusionGemmaForBlockDiffusion(_config()).eval()
    _randomise(hf, 1)
    path = save_checkpoint(hf, tmp_path_factory.mktemp("dgc") / "tiny")
    return path, dg.DiffusionGemmaForBlockDiffusion.from_pretrained(path).eval()


def mid_checkpoint(tmp_path_factory, layer_types: list[str]) -> Path:
    """A saved mid-size DiffusionGemma (`MID` widths, past the kernels' smallest tiles) with these
    layers and a 32-row canvas: the GPU tests' second size."""
    torch.manual_seed(1)
    cfg = _config(**MID, num_hidden_layers=len(layer_types), layer_types=layer_types)
    cfg.canvas_length = 32
    hf = dg.DiffusionGemmaForBlockDiffusion(cfg).eval()
    _randomise(hf, 2)
    return save_checkpoint(hf, tmp_path_factory.mktemp("dgmid") / "mid")


def byte_vocab_checkpoint(tmp_path_factory, seed: int) -> Path:
    """A saved tiny DiffusionGemma over the whole byte tokenizer (260 ids, every byte a token;
    stop: <|endoftext|> only): the structured-output tests' grammars need `{`, `"` and letters."""
    from conftest import EOS_ID

    torch.manual_seed(0)
    hf = dg.DiffusionGemmaForBlockDiffusion(_config(vocab_size=260)).eval()
    _randomise(hf, seed)
    path = save_checkpoint(hf, tmp_path_factory.mktemp("dgbytes") / "g")
    gen = json.loads((path / "generation_config.json").read_text())
    gen.update(eos_token_id=[EOS_ID], pad_token_id=EOS_ID)
    (path / "generation_config.json").write_text(json.dumps(gen))
    return path


def save_checkpoint(hf, path: Path) -> Path:
    """Save a transformers DiffusionGemma with the test stop ids and the byte tokenizer."""
    hf.save_pretrained(path)
    gen = json.loads((path / "generation_config.json").read_text())
    gen.update(eos_token_id=list(STOPS), pad_token_id=0)
    (path / "generation_config.json").write_text(json.dumps(gen))
    _byte_tokenizer().save(str(path / "tokenizer.json"))
    return path


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(6, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _expected(seq: list[int], max_new: int) -> list[int]:
    """transformers' new tokens as dlmrt reports them: cut at max_new, kept up to the first stop."""
    seq = seq[:max_new]
    stop = next((i for i, t in enumerate(seq) if t in STOPS), None)
    return seq if stop is None else seq[: stop + 1]


SETTINGS = [
    dict(max_denoising_steps=6, confidence_threshold=50.0),  # step cap
    dict(stability_threshold=0, confidence_threshold=50.0),  # stops after one step
    dict(stability_threshold=1, confidence_threshold=50.0, entropy_bound=3.0),  # stable argmax
    dict(stability_threshold=2, confidence_threshold=50.0, t_min=0.1, t_max=0.3),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> tuple[Path, object]:
    """`tiny_checkpoint`, as a fixture for the modules that import it."""
    return tiny_checkpoint(tmp_path_factory)
