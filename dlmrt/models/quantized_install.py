"""Install quantized (FP8 or NVFP4) weights into a built model: which projections run quantized,
and who quantizes their input.

`install_quantized(model, weights, rows)` takes the loader's `{parameter name: Fp8Weight or
Nvfp4Weight}` (per-channel e4m3, `dlmrt/formats/fp8.py`; `dlmrt/formats/nvfp4.py`) and returns the
names it did not install (the loader dequantizes those into their bf16 parameters). What runs FP8,
and why:
- Routed experts (LLaDA2, DiffusionGemma; `expert_install.py`): always. Their GEMMs read weights,
  not compute (a 32-row block touches most experts): W8A8 (kernels/moe_mlp_fp8.py: the activations
  quantized per group, the codes fed to an FP8 MMA) unless weight-only W8A16 (codes converted to
  bf16 in registers) times faster at the block rows (`ops/moe_fp8_choice.py`); routing is unchanged.
- Dense linears of every family (q|k|v, o, gate|up, down, the LM head; a tied LM head gets an
  FP8 copy of the embedding): FP8 GEMMs, on cuBLAS or kernels/fp8_gemm.py, kept where they
  measure faster than bf16 at the model's block rows (`ops/fp8_choice.py`). Their activations
  are quantized inside the producer where one is fused (RMSNorm `fp8_out`, silu_mul_fp8: QwenDLM
  and LLaDA2's q|k|v, gate|up, down, head), else by a row quantizer before the GEMM (o / dense,
  DiffusionGemma's projections and head: the measurement includes it).
- NVFP4 (`Nvfp4Weight`, dlmrt/formats/nvfp4.py): routed experts on the W4A16 expert kernel; dense
  gated MLPs (QwenDLM, LLaDA2's first dense layers, DiffusionGemma's dense GeGLU) whose gate, up and
  down are all NVFP4 as `Nvfp4Linear`s (models/nvfp4_linear.py: gate|up one GEMM, the dense W4A16
  kernel). The loader calls this on CUDA, and on the CPU only for W4A4 emulation
  (loading/placement.py): the CPU path otherwise dequantizes NVFP4 weights at load.
- Never: shared experts (their input is shared with the router), embeddings, norms, routers, the ORL
  adapter and DiffusionGemma's self-conditioning MLP (as in the ORL paper).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from dlmrt.formats.fp8 import Fp8Weight, quantize_per_channel
from dlmrt.formats.nvfp4 import Nvfp4Weight
from dlmrt.models.expert_install import install_experts
from dlmrt.models.fp8_glu_install import install_glu
from dlmrt.models.fp8_linear import Fp8Linear
from dlmrt.models.layers import GeGLU, SwiGLU
from dlmrt.models.nvfp4_linear import Nvfp4Linear
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops.fp8_choice import use_fp8_gemm
from dlmrt.ops.nvfp4_choice import use_nvfp4_dense

log = logging.getLogger("dlmrt")


def _cat(weights: list[Fp8Weight]) -> Fp8Weight:
    return Fp8Weight(torch.cat([w.qweight for w in weights]), torch.cat([w.scale for w in weights]))


def _free(*linears: nn.Linear) -> None:
    for lin in linears:  # the bf16 copy is never read again: give its memory back
        lin.weight = nn.Parameter(lin.weight.new_empty(0), requires_grad=False)


class Installer:
    def __init__(self, model: nn.Module, fp8: dict, rows: int, emulate: bool = False) -> None:
        self.fp8 = {n: w for n, w in fp8.items() if isinstance(w, Fp8Weight)}
        self.nvfp4 = {n: w for n, w in fp8.items() if isinstance(w, Nvfp4Weight)}
        self.model, self.rows = model, rows
        self.dtype = model.embed_table.dtype
        self.device = model.embed_table.device
        self.done: list[str] = []
        self.emulate = emulate  # W4A4 emulation: every all-NVFP4 dense MLP is installed

    def linear(
        self, names: list[str], fused_input: bool = True, w: Fp8Weight | None = None
    ) -> Fp8Linear | None:
        """An Fp8Linear of the concatenated weights of `names` (or of `w`) if all are FP8 and
        the FP8 GEMM wins at the block rows, else None."""
        given = w
        if given is None and not all(n in self.fp8 for n in names):
            return None
        w = given or _cat([self.fp8[n] for n in names])
        n_out, k = w.shape
        ok, why, config = use_fp8_gemm(self.rows, n_out, k, self.device, fused_input)
        log.debug("fp8 %s: %s (%s)", names[0].rsplit(".", 2)[0], "FP8" if ok else "bf16", why)
        if not ok:
            return None
        if given is None:  # a weight passed in (a tied head's copy) was never the loader's
            self.done += names
        plan = None
        if config is not None:
            plan = fp8_ops.GemmPlan.new(self.rows, n_out, config, self.device)
        return Fp8Linear(
            Fp8Weight(w.qweight.to(self.device), w.scale.to(self.device)), self.dtype, plan
        )

    def nvfp4_to_device(self, w: Nvfp4Weight) -> Nvfp4Weight:
        return w.to(self.device)

    def nvfp4_mlp(self, prefix: str, mlp: nn.Module) -> bool:
        """A dense gated MLP whose gate, up and down are all NVFP4: gate|up as one `Nvfp4Linear`
        (each half keeps its global scale, per row), down as another; the bf16 weights freed.
        False (nothing done) unless all three are NVFP4."""
        names = [f"{prefix}.{p}_proj.weight" for p in ("gate", "up", "down")]
        if not all(n in self.nvfp4 for n in names):
            return False
        if not self.emulate:  # W4A16 only where it is faster (ops/nvfp4_choice.py)
            gate_up, down = self.nvfp4[names[0]].shape, self.nvfp4[names[2]].shape
            shapes = [(2 * gate_up[0], gate_up[1]), (down[0], down[1])]
            ok, why = use_nvfp4_dense(self.rows, shapes, self.device)
            log.debug("nvfp4 %s: %s (%s)", prefix, "W4A16 kernel" if ok else "dequantized", why)
            if not ok:
                return False
        ws = {n: self.nvfp4_to_device(self.nvfp4[n]) for n in names}
        mlp.gate_up_fp8 = Nvfp4Linear({n: ws[n] for n in names[:2]})
        mlp.down_proj = Nvfp4Linear({names[2]: ws[names[2]]})
        mlp.gate_up_weight = None
        _free(mlp.gate_proj, mlp.up_proj)
        self.done += names
        log.debug("nvfp4 %s: NVFP4 weight-only W4A16 (dense MLP)", prefix)
        return True


def _swap(parent: nn.Module, name: str, new: nn.Module | None) -> None:
    """parent.name = new (None: keep the old one), with the old module's forward hooks: tensor
    parallelism hangs its all-reduce on the row-parallel linears (distributed/shard.py)."""
    if new is None:
        return
    old = getattr(parent, name)
    for hook in old._forward_pre_hooks.values():
        new.register_forward_pre_hook(hook)
    for hook in old._forward_hooks.values():
        new.register_forward_hook(hook)
    setattr(parent, name, new)


def _block_layer(ins: Installer, prefix: str, layer: nn.Module) -> None:
    attn = getattr(layer, "self_attn", None) or layer.attention
    if hasattr(attn, "qkv_fp8"):  # QwenDLM: q|k|v as one FP8 GEMM
        qkv = ins.linear([f"{prefix}.self_attn.{p}_proj.weight" for p in "qkv"])
        if qkv is not None:
            attn.qkv_fp8, attn.qkv_weight = qkv, None
            _free(attn.q_proj, attn.k_proj, attn.v_proj)
    else:  # LLaDA2: query_key_value is already one linear
        qkv = ins.linear([f"{prefix}.attention.query_key_value.weight"])
        if qkv is not None:
            attn.query_key_value = qkv
    layer.input_layernorm.fp8_out = qkv is not None  # the norm's one consumer is FP8
    o_name = "o_proj" if hasattr(attn, "o_proj") else "dense"
    names = [f"{prefix}.{'self_attn' if o_name == 'o_proj' else 'attention'}.{o_name}.weight"]
    _swap(attn, o_name, ins.linear(names, fused_input=False))  # input quantized before the GEMM
    mlp = layer.mlp
    if type(mlp) is SwiGLU:  # a dense MLP (never the adapter or shared experts)
        p = f"{prefix}.mlp"
        if ins.nvfp4_mlp(p, mlp):  # its input stays bf16 (no NVFP4 activation producer)
            return
        mlp.gate_up_fp8 = ins.linear([f"{p}.gate_proj.weight", f"{p}.up_proj.weight"])
        if mlp.gate_up_fp8 is not None:
            mlp.gate_up_weight = None
            _free(mlp.gate_proj, mlp.up_proj)
            layer.post_attention_layernorm.fp8_out = True
        down = ins.linear([f"{p}.down_proj.weight"], fused_input=mlp.gate_up_fp8 is not None)
        if down is not None:
            _swap(mlp, "down_proj", down)
            mlp.down_fp8 = mlp.gate_up_fp8 is not None
            install_glu(p, mlp, ins.rows, gelu=False)
    elif hasattr(mlp, "experts"):
        projs = ("gate_proj", "up_proj", "down_proj")
        install_experts(ins, f"{prefix}.mlp.experts", mlp.experts, projs, mlp.gate.top_k, "silu")


def install_quantized(
    model: nn.Module, weights: dict, rows: int, emulate: bool = False
) -> list[str]:
    """Install what runs FP8 or NVFP4 (see the module docstring; NVFP4: routed experts and dense
    gated MLPs whose three projections are all NVFP4, those where the kernel is faster unless
    `emulate`: W4A4 emulation installs them all); returns the names left to dequantize."""
    ins = Installer(model, weights, rows, emulate)
    is_block = hasattr(model, "adapter")  # QwenDLM / LLaDA2 (BlockLM) vs DiffusionGemma
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}"
        if is_block:
            _block_layer(ins, prefix, layer)
        else:
            _gemma_layer(ins, prefix, layer)
    head = ins.linear(["lm_head.weight"], fused_input=is_block, w=_tied_head(ins, model))
    if head is not None:
        _swap(model, "lm_head", head)
        if is_block:
            model.model.norm.fp8_out = True
    return [n for n in weights if n not in set(ins.done)]


def _tied_head(ins: Installer, model: nn.Module) -> Fp8Weight | None:
    """FP8 codes of a tied LM head (the embedding stays bf16 for the lookups; the head's GEMM
    reads the copy), if the model runs FP8 weights at all; else None."""
    head = model.lm_head
    if "lm_head.weight" in ins.fp8 or not ins.fp8 or not isinstance(head, nn.Linear):
        return None
    if head.weight.data_ptr() != model.embed_table.data_ptr():
        return None
    return quantize_per_channel(head.weight.detach())


def _gemma_layer(ins: Installer, prefix: str, layer: nn.Module) -> None:
    """DiffusionGemma: routed experts, q|k|v (full layers q|k) as one FP8 GEMM, o, and the dense
    GeGLU beside the experts (NVFP4 if all three are, else FP8 gate|up and down)."""
    projs, k = ("gate_up_proj", "down_proj"), layer.router.k
    install_experts(ins, f"{prefix}.experts", layer.experts, projs, k, "gelu_tanh")
    attn, p = layer.self_attn, f"{prefix}.self_attn"
    linears = [getattr(attn, f"{n}_proj") for n in "qkv"]  # full layers: no v_proj (K = V)
    names = [f"{p}.{n}_proj.weight" for n, lin in zip("qkv", linears) if lin is not None]
    qkv = ins.linear(names, fused_input=False)
    if qkv is not None:
        attn.qkv_fp8, attn.qkv_weight = qkv, None
        _free(*(lin for lin in linears if lin is not None))
    _swap(attn, "o_proj", ins.linear([f"{p}.o_proj.weight"], fused_input=False))
    mlp, p = layer.mlp, f"{prefix}.mlp"
    if type(mlp) is not GeGLU or ins.nvfp4_mlp(p, mlp):
        return
    gate_up = ins.linear([f"{p}.gate_proj.weight", f"{p}.up_proj.weight"], fused_input=False)
    if gate_up is not None:
        mlp.gate_up_fp8, mlp.gate_up_weight = gate_up, None
        _free(mlp.gate_proj, mlp.up_proj)
    _swap(mlp, "down_proj", ins.linear([f"{p}.down_proj.weight"], fused_input=False))
    install_glu(p, mlp, ins.rows, gelu=True)
