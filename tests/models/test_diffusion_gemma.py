"""DiffusionGemma parity with transformers' DiffusionGemmaForBlockDiffusion (the oracle)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from dg_helpers import CANVAS, F_, VOCAB, WINDOW, S, _config, _randomise  # noqa: F401
from safetensors.torch import load_file, save_file

from dlmrt.attention import AttnContext
from dlmrt.errors import CheckpointError
from dlmrt.impls.dense import ProjectionConcat, StackedProjection
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.loading.deferred import materialize

dg = pytest.importorskip("transformers.models.diffusion_gemma")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> tuple[Path, object]:
    torch.manual_seed(0)
    hf = dg.DiffusionGemmaForBlockDiffusion(_config()).eval()
    _randomise(hf, 1)
    path = tmp_path_factory.mktemp("dg") / "tiny"
    hf.save_pretrained(path)
    return path, hf


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_config_from_checkpoint(ckpt):
    path, _ = ckpt
    cfg = load_checkpoint(path, torch.float32, CPU).config
    assert cfg.layer_types == (S, S, F_, S, F_)
    assert cfg.head_dims == (8, 8, 16, 8, 16) and cfg.kv_heads == (2, 2, 1, 2, 1)
    assert cfg.rope[F_].rotary_factor == 0.5 and cfg.rope[S].theta == 10000.0
    assert (cfg.sliding_window, cfg.canvas_length, cfg.final_logit_softcapping) == (WINDOW, 8, 30.0)


@pytest.mark.parametrize("length", [3, 17])
def test_encoder_logits_match_transformers(ckpt, length):
    """Encoder mode (causal, sliding window) equals transformers' encoder + tied head + softcap."""
    path, hf = ckpt
    ours = load_checkpoint(path, torch.float32, CPU).model
    ids = _ids(length, length)
    with torch.no_grad():
        hidden = hf.model.encoder(input_ids=ids[None]).last_hidden_state
        logits = hf.lm_head(hidden)[0].float()
        ref = 30.0 * torch.tanh(logits / 30.0)
        out = ours(ids, AttnContext(torch.arange(length), block_size=1))
    assert _rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("prompt_len", [2, 13])
@pytest.mark.parametrize("self_cond", [False, True])
def test_decoder_logits_match_transformers(ckpt, prompt_len, self_cond):
    """Decoder mode over [prompt | canvas] equals transformers' forward with its DynamicCache:
    the sliding window (5) is shorter than the 13-token prompt, so the sliding rule matters."""
    path, hf = ckpt
    ours = load_checkpoint(path, torch.float32, CPU).model
    prompt, canvas = _ids(prompt_len, 7), _ids(CANVAS, 8)
    sc = (
        torch.randn(CANVAS, VOCAB, generator=torch.Generator().manual_seed(9)) * 3
        if self_cond
        else None
    )
    with torch.no_grad():
        ref = hf(
            input_ids=prompt[None],
            decoder_input_ids=canvas[None],
            self_conditioning_logits=None if sc is None else sc[None],
        ).logits[0]
        rows = torch.cat((prompt, canvas))
        out = ours(rows, AttnContext(torch.arange(len(rows)), block_size=1), CANVAS, sc)
    assert out.shape == (prompt_len + CANVAS, VOCAB)
    assert _rel_err(out[-CANVAS:], ref) <= 1e-5


def test_self_conditioning_changes_canvas_only(ckpt):
    path, _ = ckpt
    ours = load_checkpoint(path, torch.float32, CPU).model
    rows = _ids(6 + CANVAS, 3)
    ctx = AttnContext(torch.arange(len(rows)), block_size=1)
    sc = torch.randn(CANVAS, VOCAB, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a, b = ours(rows, ctx, CANVAS), ours(rows, ctx, CANVAS, sc)
        enc = ours(rows[:6], AttnContext(torch.arange(6), block_size=1))
    assert torch.equal(a[:6], b[:6]) and torch.allclose(a[:6], enc, atol=1e-6)
    assert not torch.allclose(a[6:], b[6:])


def test_tied_copies_and_vision_are_handled(ckpt, tmp_path, caplog):
    """A checkpoint with full encoder AND decoder copies loads the same; vision is skipped."""
    path, _ = ckpt
    weights = load_file(str(path / "model.safetensors"))
    enc = "model.encoder.language_model."
    for name in list(weights):
        if name.startswith("model.decoder.") and "self_conditioning" not in name:
            if not name.endswith("layer_scalar"):
                weights[enc + name[len("model.decoder.") :]] = weights[name].clone()
    (tmp_path / "both").mkdir()
    save_file(weights, str(tmp_path / "both" / "model.safetensors"))
    (tmp_path / "both" / "config.json").write_text((path / "config.json").read_text())
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        a = load_checkpoint(path, torch.float32, CPU).model.state_dict()
        b = load_checkpoint(tmp_path / "both", torch.float32, CPU).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "105 tied duplicate" in caplog.text and "ignoring 16 tensor(s)" in caplog.text
    assert not torch.equal(
        a["model.layers.0.layer_scalar"], a["model.layers.0.encoder_layer_scalar"]
    )


def test_missing_text_field_names_it(ckpt, tmp_path):
    import json

    path, _ = ckpt
    (tmp_path / "m").mkdir()
    cfg = json.loads((path / "config.json").read_text())
    del cfg["text_config"]["num_experts"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "m" / "model.safetensors").symlink_to(path / "model.safetensors")
    with pytest.raises(CheckpointError, match="text_config.num_experts"):
        load_checkpoint(tmp_path / "m", torch.float32, CPU)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_engine_soft_embedding_is_the_former_one_bit_for_bit(ckpt, dtype):
    """The engine's step hands the model sc_probs (`ops.vocab.sc_probs` of its tempered logits)
    instead of those logits in the model dtype: the soft embedding and the raw-then-softcapped
    logits are the former ones bit for bit (CPU tokens do not move)."""
    from dlmrt.ops import vocab

    model = load_checkpoint(ckpt[0], dtype, CPU).model
    z = 4 * torch.randn(
        CANVAS, model.lm_head.out_features, generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        # the former path: the sc buffer held z in the model dtype
        then = model.soft_embedding(z.to(dtype), 1.0)
        now = model.embed_probs(vocab.sc_probs(z, dtype))
    assert torch.equal(now, then)
    ids = _ids(CANVAS, 4)
    ctx = AttnContext(torch.arange(CANVAS), 1, None)
    with torch.no_grad():
        logits = model(ids, ctx, CANVAS, z.to(dtype))
        raw = model(ids, ctx, CANVAS, sc_probs=vocab.sc_probs(z, dtype), softcap=False)
    assert raw.dtype == dtype
    assert torch.equal(vocab.softcapped(raw, model.cfg.final_logit_softcapping), logits)


def test_deferred_attention_fuses_on_meta_and_re_fuses_once_materialized(ckpt):
    """A deferred (NVFP4) q/k/v stays on meta until the install declines it: fuse() stacks it
    there, so `materialize` re-fuses it (stacked on CUDA); on the CPU that leaves it unfused, as
    HF runs it, with the materialized values."""
    model = load_checkpoint(ckpt[0], torch.float32, CPU).model
    attn = model.model.layers[0].self_attn
    name = next(n for n, m in model.named_modules() if m is attn)
    values = {
        f"{name}.{p}.weight": getattr(attn, p).weight.detach().clone()
        for p in ("q_proj", "k_proj", "v_proj")
    }
    x = torch.randn(3, attn.q_proj.in_features)
    expected = torch.cat([x @ w.T for w in values.values()], dim=-1)
    for p in ("q_proj", "k_proj", "v_proj"):
        getattr(attn, p).weight = torch.nn.Parameter(
            torch.empty_like(values[f"{name}.{p}.weight"], device="meta")
        )
    attn.fuse()
    assert isinstance(attn.qkv, StackedProjection) and attn.qkv.weight.is_meta
    materialize(model, values)
    assert isinstance(attn.qkv, ProjectionConcat)
    torch.testing.assert_close(attn.qkv(x), expected)
