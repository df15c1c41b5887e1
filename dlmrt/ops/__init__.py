"""Custom ops, each resolved ONCE to its Triton kernel or its torch twin (`ops.reference`),
recorded in the choices registry (`ops/choices.py`: logged once, listed by `choices.report()`).
Triton runs on CUDA tensors when `triton` imports and DLMRT_OPS is not "torch"; the CPU always
runs the twins. Tests force either implementation with `use(impl)`."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from dlmrt import envs
from dlmrt.ops import arena_launch, canvas, choices, flash_attn4, one_pass, reference, vocab
from dlmrt.ops import canvas_launch as canvas_launch  # (the line above is full)
from dlmrt.ops.reference import select_rows, write_rows  # noqa: F401 (arena writes, any dtype)

_IMPL: dict[str, str] = {}  # the registry's picks, per op: the per-call lookup
OPS = ("arena_attention", "token_stats", "rms_norm", "qk_norm_rope", "silu_mul", "softmax_probs")
OPS += ("moe_mlp", "moe_route_grouped", "moe_route_softmax", "fp8", "canvas_attention")
OPS += ("canvas_vocab", "linear_nvfp4", "gemma_norms", "qkv_norm_rope", "vocab_pass")
OPS += ("canvas_vocab_pass",)
# dtypes the Triton MoE kernels take (fp64 models run the twins everywhere)
_MOE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _triton_ok() -> tuple[bool, str]:
    if envs.ops_impl() == "torch":
        return False, "DLMRT_OPS=torch"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    return True, "triton available"


def implementation(name: str) -> str:
    """'triton' or 'torch': what `name` resolves to (deciding, and logging, on first use)."""
    if name not in _IMPL:
        ok, why = _triton_ok()
        _IMPL[name] = choices.record(f"op {name}", "triton" if ok else "torch", why).pick
        if ok:  # the kernels' PDL switch (kernels/pdl.py), from DLMRT_PDL
            mode = envs.pdl()
            switch = importlib.import_module("dlmrt._kernels.pdl")
            switch.ENABLED, switch.GEMMS = mode != "0", mode == "1"
            pick = {"0": "off", "1": "on", "nogemm": "on but the GEMMs"}[mode]
            choices.record("programmatic dependent launch", pick, f"DLMRT_PDL={mode}")
    return _IMPL[name]


def _resolve(name: str, module_name: str | None = None) -> Callable:
    if implementation(name) == "triton":
        module = importlib.import_module(f"dlmrt._kernels.{module_name or name}")
        return getattr(module, name)
    return getattr(reference, name)


def use(impl: str | None) -> None:
    """Force every op to 'triton' or 'torch' (tests, benchmarks); None re-resolves from the environment."""
    _IMPL.clear()
    choices.forget("op ")
    canvas_launch.forget()
    if impl is not None:
        for name in OPS:
            _IMPL[name] = choices.record(f"op {name}", impl, "forced by ops.use").pick


def arena_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    scale: float,
    one_block: bool = False,
) -> torch.Tensor:
    """Block-causal attention of rows at `positions` over one arena layer. See kernels/arena_attention.py.

    one_block: every row is in one block (a round); then FlashAttention-4 runs instead of our
    kernel where it is installed and measured faster (ops/flash_attn4.py)."""
    if q.is_cuda and implementation("arena_attention") == "triton":
        if one_block and flash_attn4.chosen(q, k, v, block_size, scale):
            return flash_attn4.arena_attention(q, k, v, positions, block_size, scale)
        splits, tiles = arena_launch.launch(q, k)
        return _resolve("arena_attention")(q, k, v, positions, block_size, scale, splits, tiles)
    return reference.arena_attention(q, k, v, positions, block_size, scale)


def canvas_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    decoder: bool,
    window: int,
    scale: float,
) -> torch.Tensor:
    """DiffusionGemma's attention of a pass (a canvas, or context rows) over one arena layer whose
    rows at `positions` it has written; `window` 0 = a full layer. Kernel: whole or key-split
    (`ops/canvas_launch.py`); twin: masked SDPA (`ops/canvas.py`), also for head dims it cannot tile."""
    fits = canvas.kernel_fits(q.shape[-1])
    if q.is_cuda and fits and implementation("canvas_attention") == "triton":
        return canvas_launch.attention(q, k, v, positions, decoder, window, scale)
    return canvas.canvas_attention(q, k, v, positions, decoder, window, scale)


# canvas_vocab's kernels, by `kernel` (engine/encoder_decoder/vocab_choice.py): kernels/ module
CANVAS_VOCAB_KERNELS = {"rows": "canvas_vocab", "split": "canvas_vocab_split"}


def canvas_vocab(
    raw: torch.Tensor,
    softcap: float | None,
    temperature: torch.Tensor,
    u: torch.Tensor,
    sc: torch.Tensor,
    kernel: str = "split",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DiffusionGemma's vocabulary pass: (argmax, entropy, inverse-CDF sample at uniforms `u`) of
    softmax(z), z = softcap tanh(raw / softcap) / T (T on the device), from the LM head's output;
    the next step's softmax(z in the model dtype) into `sc`. `kernel`: "split" (rows x vocabulary
    splits) or "rows" (one program per row), kernels/canvas_vocab*.py; twin `ops/vocab.py`."""
    if kernel not in CANVAS_VOCAB_KERNELS:
        raise ValueError(
            f"canvas_vocab: kernel {kernel!r}: expected one of {list(CANVAS_VOCAB_KERNELS)}"
        )
    fast = raw.is_cuda and raw.is_contiguous() and sc.is_contiguous()
    if fast and implementation("canvas_vocab") == "triton":
        module = CANVAS_VOCAB_KERNELS[kernel]
        return _resolve("canvas_vocab", module)(raw, softcap, temperature, u, sc)
    return vocab.canvas_vocab(raw, softcap, temperature, u, sc)


def canvas_vocab_pass(
    h: torch.Tensor,
    weight: torch.Tensor,
    embed: torch.Tensor,
    softcap: float | None,
    temperature: torch.Tensor,
    u: torch.Tensor,
    soft: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`canvas_vocab` from the final normed hidden h, the LM head (h's dtype) and the next step's
    p @ E (into `soft`) in one stream: kernels/canvas_vocab_pass.py; twin `ops/vocab.py`."""
    fast = h.is_cuda and weight.dtype == h.dtype == embed.dtype
    if fast and implementation("canvas_vocab_pass") == "triton":
        return _resolve("canvas_vocab_pass")(h, weight, embed, softcap, temperature, u, soft)
    return vocab.canvas_vocab_pass(h, weight, embed, softcap, temperature, u, soft)


def vocab_pass(
    h: torch.Tensor,
    weight: torch.Tensor,
    embed: torch.Tensor | None,
    temperature: float,
    z_temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One pass over the vocabulary from the final normed hidden h [rows, hidden]: the head
    `weight` [vocab, hidden], (argmax, confidence, entropy, log_z) of softmax(logits / T) (T <= 0:
    greedy, T = 1) and z = softmax(logits / z_temperature) @ embed (None: no z), without writing
    the logits. Kernel: kernels/vocab_pass.py (floating weights of h's dtype); twin: today's
    head, `token_stats` and residual softmax (`dlmrt/ops/one_pass.py`)."""
    fast = h.is_cuda and weight.dtype == h.dtype and (embed is None or embed.dtype == h.dtype)
    if fast and implementation("vocab_pass") == "triton":
        return _resolve("vocab_pass")(h, weight, embed, temperature, z_temperature)
    return one_pass.vocab_pass(h, weight, embed, temperature, z_temperature)


def token_stats(
    logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """argmax, confidence, entropy, log_z of softmax(logits / T), one pass. See kernels/token_stats.py."""
    fn = _resolve("token_stats") if logits.is_cuda else reference.token_stats
    return fn(logits, temperature)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x) over the last dim of x [rows, n]. See kernels/rms_norm.py."""
    fn = _resolve("rms_norm") if x.is_cuda and x.stride(-1) == 1 else reference.rms_norm
    return fn(x, weight, eps)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm over the last dim (gain in fp32, one cast; None: no gain). Triton on
    contiguous CUDA tensors (kernels/rms_norm.py), else `reference.gemma_rms_norm`."""
    if x.is_cuda and x.is_contiguous() and implementation("rms_norm") == "triton":
        return _resolve("gemma_rms_norm", "rms_norm")(x, weight, eps)
    return reference.gemma_rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the residual add fused into the norm."""
    if x.is_cuda and x.stride(-1) == 1 and implementation("rms_norm") == "triton":
        return _resolve("add_rms_norm", "rms_norm")(x, residual, weight, eps)
    return reference.add_rms_norm(x, residual, weight, eps)


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-head RMSNorm + RoPE, head-major, optionally written at arena rows. See kernels/qk_norm_rope.py."""
    fn = _resolve("qk_norm_rope") if x.is_cuda else reference.qk_norm_rope
    return fn(x, weight, cos, sin, eps, out, positions)


def qkv_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_arena: torch.Tensor,
    v_arena: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """An arena pass's fused q|k|v [rows, heads + 2 kv_heads, head_dim]: returns q normed and
    rotated [heads, rows, head_dim], writes k (normed, rotated) and v at `positions` of their arena
    layers. One launch on CUDA (kernels/qk_norm_rope.py), resolved as its own op."""
    fn = _resolve("qkv_norm_rope", "qk_norm_rope") if qkv.is_cuda else None
    fn = fn or reference.qkv_norm_rope
    return fn(qkv, q_weight, k_weight, cos, sin, eps, k_arena, v_arena, positions)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up on the fused gate_up projection output. See kernels/silu_mul.py."""
    fn = _resolve("silu_mul") if gate_up.is_cuda else reference.silu_mul
    return fn(gate_up)


def softmax_probs(
    logits: torch.Tensor, log_z: torch.Tensor, temperature: float, dtype: torch.dtype
) -> torch.Tensor:
    """exp(logits / T - log_z) in `dtype`, one pass. See kernels/softmax_probs.py."""
    fn = _resolve("softmax_probs") if logits.is_cuda else reference.softmax_probs
    return fn(logits, log_z, temperature, dtype)


def moe_mlp(
    x: torch.Tensor,
    weights: torch.Tensor,
    index: torch.Tensor,
    gate_up: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    down: torch.Tensor,
    activation: str,
    sum_dtype: torch.dtype | None = None,
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routed gated-MLP experts (stacked [E, ...] weights), weighted sum per row; see
    `reference.moe_mlp`. CUDA: a grouped GEMM with device-side grouping, no host sync, so it can be
    captured in a CUDA graph (kernels/moe_mlp.py; it sums the k slots in fp32 whatever `sum_dtype`).
    `scales` (gate [E, I], up [E, I], down [E, H] fp32): the weights are FP8 codes, converted in the
    kernel's registers; the twin dequantizes them to x's dtype first. `add` [rows, H] in x's dtype
    (the shared experts' output): result + add, rounded as that add in x's dtype (on CUDA in the
    kernel's last pass). FP8 W8A8 experts (activations quantized too): `dlmrt/ops/moe_fp8.py`."""
    fast = x.is_cuda and x.dtype in _MOE_DTYPES
    if fast and implementation("moe_mlp") == "triton":
        fn = _resolve("moe_mlp")
        return fn(x, weights, index, gate_up, down, activation, sum_dtype, scales, add=add)
    if scales is not None:
        gate, up = gate_up if isinstance(gate_up, tuple) else gate_up.chunk(2, dim=1)
        gate, up, down = (
            (w.float() * s.unsqueeze(-1)).to(x.dtype) for w, s in zip((gate, up, down), scales)
        )
        gate_up = (gate, up)
    y = reference.moe_mlp(x, weights, index, gate_up, down, activation, sum_dtype)
    return y if add is None else y + add


def moe_route_grouped(
    logits: torch.Tensor,
    expert_bias: torch.Tensor | None,
    n_group: int,
    topk_group: int,
    top_k: int,
    norm_topk_prob: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA2's sigmoid group-limited routing, one kernel on CUDA. See `reference.moe_route_grouped`."""
    fn = _resolve("moe_route_grouped", "moe_route") if logits.is_cuda else None
    fn = fn or reference.moe_route_grouped
    return fn(logits, expert_bias, n_group, topk_group, top_k, norm_topk_prob, scaling)


def moe_route_softmax(
    logits: torch.Tensor, per_expert_scale: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """DiffusionGemma's softmax top-k routing, one kernel on CUDA. See `reference.moe_route_softmax`."""
    fn = _resolve("moe_route_softmax", "moe_route") if logits.is_cuda else None
    fn = fn or reference.moe_route_softmax
    return fn(logits, per_expert_scale, top_k)
