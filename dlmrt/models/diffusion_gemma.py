"""DiffusionGemma (`DiffusionGemmaForBlockDiffusion`): one Gemma-4 MoE text tower in two modes.

One forward for every caller. Its attention context is data (`diffusion_gemma_context.py`): no
cache (the rows are [context rows | canvas rows], the last `canvas` rows the canvas), a growing
`ContextCache` (a pass is new context rows, an encoder pass whose K/V are appended, or the canvas
alone, a decoder pass), or the engine's static arena in `ctx.kv` (device-side positions: graph-
capturable). Context rows see context keys causally (sliding layers within the window); canvas
rows see the whole canvas and the context (sliding layers: the last sliding_window - 1 context
positions before the canvas). Canvas rows get the self-conditioning input and the decoder copy of
`layer_scalar`; context rows never see the canvas.

Weights: `model.decoder.*` and `model.encoder.language_model.*` map to one set (`checkpoint_name`);
only `layer_scalar` has separate encoder/decoder copies. The vision tower is skipped (text only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt import ops
from dlmrt.account import label
from dlmrt.attention import AttnContext
from dlmrt.impls.dense import ProjectionConcat, StackedProjection
from dlmrt.impls.slot import set_slot
from dlmrt.models.diffusion_gemma_config import SLIDING, DiffusionGemmaConfig
from dlmrt.models.diffusion_gemma_context import ArenaContext, ContextCache, GrowingContext, KeyNorm
from dlmrt.models.experts import Experts
from dlmrt.models.layers import GeGLU, GemmaRMSNorm, fuse_weights, rope_tables
from dlmrt.models.residual import SelfConditioning
from dlmrt.ops import branches, gemma
from dlmrt.parallel import group as tp
from dlmrt.parallel import vocab


class Attention(nn.Module):
    """Scale 1.0; q/k RMSNorm (weight) before RoPE, v RMSNorm (none); full layers: V = K, no v_proj."""

    def __init__(self, cfg: DiffusionGemmaConfig, i: int) -> None:
        super().__init__()
        hidden, self.heads = cfg.hidden_size, cfg.num_attention_heads
        self.head_dim, self.kv_heads, self.eps = cfg.head_dims[i], cfg.kv_heads[i], cfg.rms_norm_eps
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        sliding = cfg.layer_types[i] == SLIDING
        self.v_proj = (
            nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False) if sliding else None
        )
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = GemmaRMSNorm(self.head_dim, self.eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, self.eps)
        self.unfuse()

    def _projs(self) -> list[nn.Linear]:
        return [p for p in (self.q_proj, self.k_proj, self.v_proj) if p is not None]

    def unfuse(self) -> None:
        """q|k|v (full layers: q|k) as separate GEMMs, one tensor (the `qkv` slot, dlmrt/impls)."""
        set_slot(self, "qkv", ProjectionConcat(self._projs()))

    def fuse(self) -> None:
        """Unfused on the CPU (a wider bf16 GEMM rounds unlike HF's three); stacked elsewhere, on
        meta too: a deferred load's `materialize` re-fuses the stack once it is allocated."""
        if self.q_proj.weight.device.type == "cpu":
            self.unfuse()
        elif (fused := fuse_weights(*self._projs())) is not None:
            set_slot(self, "qkv", StackedProjection(fused))

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kv = self.kv_heads * self.head_dim
        sizes = (self.heads * self.head_dim, kv) + ((kv,) if self.v_proj is not None else ())
        return self.qkv(x).split(sizes, dim=-1)

    def forward(self, x: torch.Tensor, rope, pos: torch.Tensor, view, layer: int, sliding: bool):
        """-> output [rows, hidden]; `view` (a context of `diffusion_gemma_context.py`) stores
        this pass's K/V where its data says and attends over the keys it makes visible."""
        rows = x.shape[0]
        parts = self._qkv(x)
        q = parts[0].view(rows, self.heads, self.head_dim)
        k = parts[1].view(rows, self.kv_heads, self.head_dim)
        v = k if self.v_proj is None else parts[2].view(rows, self.kv_heads, self.head_dim)
        # transformers' roundings: norm (fp32, one cast), then RoPE in the model dtype
        with label("q_norm_rope", q):
            q = gemma.qk_norm_rope(q, self.q_norm.weight, *rope, self.eps)  # [heads, rows, d]
        out = view.attend(layer, sliding, q, k, v, KeyNorm(self.k_norm.weight, rope, self.eps))
        return self.o_proj(out.transpose(0, 1).reshape(rows, -1))


class Router(nn.Module):
    """softmax(proj(x)) in fp32, top-k, renormalised, times per_expert_scale, where the input
    x = RMSNorm_noweight(r) * scale / sqrt(hidden) comes from `ops.gemma.attn_residual`."""

    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.num_experts))
        self.k, self.root = cfg.top_k_experts, cfg.hidden_size**-0.5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with label("route", logits := self.proj(x)):  # proj runs first, in its own range
            return ops.moe_route_softmax(logits, self.per_expert_scale, self.k)


class Layer(nn.Module):
    _NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm")
    _NORMS += ("post_feedforward_layernorm", "post_feedforward_layernorm_1")
    _NORMS += ("post_feedforward_layernorm_2", "pre_feedforward_layernorm_2")

    def __init__(self, cfg: DiffusionGemmaConfig, i: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, i)
        self.mlp = GeGLU(cfg.hidden_size, cfg.intermediate_size)
        e, h, inter = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.router = Router(cfg)
        self.experts = Experts(
            e, h, inter, "gelu_tanh", fused_gate_up=True, sum_in_model_dtype=True
        )
        for name in self._NORMS:
            setattr(self, name, GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        self.eps = cfg.rms_norm_eps
        self.register_buffer("layer_scalar", torch.ones(1))  # decoder copy
        self.register_buffer("encoder_layer_scalar", torch.ones(1))

    def forward(self, h, rope, pos, view, layer: int, sliding: bool):
        """The residual stream's norms and adds are two fused ops (`dlmrt/ops/gemma.py`). The
        dense MLP and the router + routed experts read the residual through their own norms and
        meet only at `layer_out`: two branches (`dlmrt/ops/branches.py`)."""
        attn = self.self_attn(self.input_layernorm(h), rope, pos, view, layer, sliding)
        gains_in = (self.post_attention_layernorm.weight, self.pre_feedforward_layernorm.weight)
        gains_in += (self.pre_feedforward_layernorm_2.weight,)
        with label("attn_residual", attn, h):
            r, x_mlp, x_moe, x_router = gemma.attn_residual(
                attn, h, gains_in, self.router.scale, self.router.root, self.eps
            )
        dense, moe = branches.fork_join(
            lambda: self.mlp(x_mlp), lambda: self.experts(x_moe, *self.router(x_router)), h
        )  # CUDA inference: router + experts on a second stream, beside the dense MLP
        gains_out = (
            self.post_feedforward_layernorm_1.weight,
            self.post_feedforward_layernorm_2.weight,
        )
        gains_out += (self.post_feedforward_layernorm.weight,)
        scalars = (self.layer_scalar, self.encoder_layer_scalar)
        with label("layer_out", dense, moe, r):
            return gemma.layer_out(dense, moe, r, gains_out, view.is_canvas, scalars, self.eps)


class Backbone(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        sc = cfg.self_conditioning_size
        self.self_conditioning = SelfConditioning(cfg.hidden_size, sc, cfg.rms_norm_eps)


class DiffusionGemma(nn.Module):
    """forward(ids, ctx, canvas, sc_logits) -> softcapped fp32 logits [rows, vocab] (with
    `softcap=False`: the LM head's output in the model dtype).

    The last `canvas` rows run in decoder mode (0: a pure encoder pass); `sc_logits` [canvas, vocab]
    are the previous step's logits (already tempered: the soft embedding is softmax(sc_logits /
    sc_temperature) @ E * sqrt(hidden)); None = zero self-conditioning input (first step). The
    engine's step passes `sc_probs` instead (those softmax probabilities, made by its vocabulary
    pass: `ops.canvas_vocab`) and takes the LM head's output before the softcap (`softcap=False`).
    """

    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @staticmethod
    def checkpoint_name(name: str) -> str | None:
        """HF tensor name -> ours (None: skipped). Encoder and decoder share every weight but
        `layer_scalar`; the decoder copy sorts first, so it is the one loaded."""
        for prefix in ("model.decoder.", "model.encoder.language_model."):
            if name.startswith(prefix):
                rest = name[len(prefix) :]
                if prefix != "model.decoder." and rest.endswith(".layer_scalar"):
                    rest = rest.replace(".layer_scalar", ".encoder_layer_scalar")
                return "model." + rest
        return None if name.startswith("model.encoder.") else name

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    def use_quantized(self, weights: dict, **how: bool | str) -> list[str]:
        """Run these FP8 / NVFP4 weights; returns the names not installed (the loader dequantizes
        them); `how`: the install's options (emulate, prefer). The sites:
        `dlmrt/impls/install.py`'s `gemma_layers`, measured at the canvas's rows."""
        from dlmrt.impls.install import gemma_layers, install_quantized  # loads on demand

        return install_quantized(self, weights, self.cfg.canvas_length, gemma_layers, **how)

    def fuse_projections(self) -> None:
        for module in self.modules():
            if hasattr(module, "fuse") and module is not self:
                module.fuse()

    @property
    def embed_table(self) -> torch.Tensor:
        return self.model.embed_tokens.weight

    def embed_scale(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(self.cfg.hidden_size**0.5, dtype=torch.float32).to(dtype)

    def soft_embedding(self, sc_logits: torch.Tensor, sc_temperature: float) -> torch.Tensor:
        """softmax(sc_logits / T) @ E * sqrt(hidden), as transformers: softmax in fp32, cast,
        then @ E (not the fused exp(x - logZ) twin)."""
        return self.embed_probs(self.self_conditioning_probs(sc_logits, sc_temperature))

    @staticmethod
    def self_conditioning_probs(sc_logits: torch.Tensor, sc_temperature: float) -> torch.Tensor:
        """softmax(sc_logits / T) in fp32 (tensor parallel: this rank's vocabulary shard, with the
        log-normaliser combined across the ranks)."""
        y, group = sc_logits.float() / sc_temperature, tp.active()
        if group is None:
            return F.softmax(y, dim=-1, dtype=torch.float32)
        return torch.exp(y - vocab.logsumexp(y, group).unsqueeze(-1))

    def embed_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """probs @ E * sqrt(hidden), probs cast to the model dtype first (tensor parallel: this
        rank's vocabulary shard of probs and E; partial sums, one all-reduce)."""
        with label("sc_embed", probs, self.embed_table):
            scale = self.embed_scale(self.embed_table.dtype)
            soft = probs.to(self.embed_table.dtype) @ self.embed_table
            return vocab.reduce_sum(soft, tp.active()) * scale

    def _embed(self, ids, canvas: int, sc_logits, sc_temperature: float, first, sc_probs, sc_embed):
        scale = self.embed_scale(self.embed_table.dtype)
        h = self.model.embed_tokens(ids) * scale
        if canvas == 0:
            return h
        soft = None
        if sc_embed is not None:  # probs @ E made by the step's one pass: `embed_probs`'s scale
            soft = sc_embed * scale
        elif sc_probs is not None:
            soft = self.embed_probs(sc_probs)
        elif sc_logits is not None:
            soft = self.soft_embedding(sc_logits, sc_temperature)
        tail = self.model.self_conditioning.inject(h[-canvas:], soft, first)
        return tail if canvas == h.shape[0] else torch.cat((h[:-canvas], tail))

    def new_cache(self, device: torch.device) -> ContextCache:
        return ContextCache(self.cfg.num_hidden_layers, device)

    def forward(
        self,
        input_ids: torch.Tensor,  # [rows]: context rows, then `canvas` canvas rows
        ctx: AttnContext,
        canvas: int = 0,
        sc_logits: torch.Tensor | None = None,  # [canvas, vocab]
        sc_temperature: float = 1.0,
        compute_logits: bool = True,
        cache: ContextCache | None = None,
        first: torch.Tensor | None = None,
        sc_probs: torch.Tensor | None = None,  # [canvas, vocab], instead of sc_logits
        softcap: bool = True,
        sc_embed: torch.Tensor | None = None,  # [canvas, hidden] sc_probs @ E, instead of sc_probs
        normed: bool = False,
    ) -> torch.Tensor | None:
        """With `cache`, the rows are either new context rows (`canvas=0`: encoded, their K/V
        appended) or the canvas alone (`canvas=rows`: decoded against the cached context). With
        an arena in `ctx.kv` (the engine's static path) likewise, at device-side positions.
        `first` ([] bool on the device, static decoder passes): when set, `sc_logits` is ignored
        (exactly sc_logits=None), so one captured graph serves a canvas's first step too.
        `softcap=False`: the LM head's output as it is (model dtype), for the caller to softcap
        (`cfg.final_logit_softcapping`) in its own pass over the vocabulary. `normed`: the final
        normed hidden instead (the LM head runs in the caller's one pass over the vocabulary,
        `ops.canvas_vocab_pass`, which also makes the next step's `sc_embed`)."""
        pos, window = ctx.positions, self.cfg.sliding_window
        if ctx.kv is not None:
            if cache is not None or canvas not in (0, pos.shape[0]):
                raise ValueError(
                    "with an arena, a pass is all context or all canvas rows, no cache"
                )
            view = ArenaContext(ctx.kv, pos, canvas > 0, window)
        else:
            view = GrowingContext(cache, pos, canvas, window)
        with label("embed", input_ids):
            h = self._embed(input_ids, canvas, sc_logits, sc_temperature, first, sc_probs, sc_embed)
        with label("rope_tables", pos):
            dims = dict(zip(self.cfg.layer_types, self.cfg.head_dims))  # kind -> head width
            ropes = rope_tables(self.cfg.rope, dims, pos, h.dtype)
        for i, (layer, kind) in enumerate(
            zip(self.model.layers, self.cfg.layer_types, strict=True)
        ):
            h = layer(h, ropes[kind], pos, view, i, kind == SLIDING)
        view.finish()
        if not compute_logits:
            return None
        if normed:
            return self.model.norm(h)
        raw = self.lm_head(self.model.norm(h))
        return ops.vocab.softcapped(raw, self.cfg.final_logit_softcapping) if softcap else raw
