"""Install a quantized checkpoint's implementation objects into a built model, once, at load.

`install_quantized(model, weights, rows, walk)` takes the loader's `{parameter name: quantized
weight}` (`Fp8Weight`, `Nvfp4Weight`, or a registered format's) and returns the names it did not
install (the loader dequantizes those into their bf16 parameters). `walk` is the family's list of
sites (`block_layers`: QwenDLM, LLaDA2; `gemma_layers`: DiffusionGemma), named by the model's
`use_quantized`; at each site the row of its weights' format (`formats.py`) builds what runs:
- q|k|v, o, the LM head (a tied head: the format's copy of the embedding, `tied_copy`): `linear`;
- a layer's dense gated MLP (never the ORL adapter, shared experts or self-conditioning, as in
  the ORL paper): `gated_mlp`;
- routed experts: `experts`;
- the norm before q|k|v, before the MLP and before the head (block layers): `norm_out` when the
  GEMMs it feeds are of that format (FP8: the norm quantizes its own output).
`prefer="memory"` (the user's `prefer`) makes the NVFP4 builders keep the weights 4-bit: the
W4A16 kernels for experts and dense MLPs, whatever the speed measurement says.
What the FP8 and NVFP4 rows choose, and why: `dense_install.py`, `expert_install.py` (their rows
are registered by `builtin_formats.py`, which the package imports). A row without a `gated_mlp`
gets `generic_gated_mlp` (below) from its `linear`.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from dlmrt.impls.activation import act_mul
from dlmrt.impls.formats import TABLE, FormatRow
from dlmrt.impls.gate_up import QuantGateUp
from dlmrt.impls.slot import carry_hooks, set_slot

PROJS = ("gate_proj", "up_proj", "down_proj")


def free(*linears: nn.Linear) -> None:
    for lin in linears:  # the bf16 copy is never read again: give its memory back
        lin.weight = nn.Parameter(lin.weight.new_empty(0), requires_grad=False)


def set_gate_up(mlp: nn.Module, gate_up: nn.Module) -> None:
    """Install `gate_up` as the MLP's first half and free its bf16 gate and up weights."""
    set_slot(mlp, "gate_up", gate_up)
    free(mlp.gate_proj, mlp.up_proj)


class Installer:
    def __init__(
        self,
        model: nn.Module,
        weights: dict,
        rows: int,
        emulate: bool = False,
        prefer: str = "speed",
    ) -> None:
        self.weights = dict(weights)
        self.model, self.rows = model, rows
        self.dtype = model.embed_table.dtype
        self.device = model.embed_table.device
        self.done: list[str] = []
        self.emulate = emulate  # W4A4 emulation: every all-NVFP4 dense MLP is installed
        # prefer="memory": NVFP4 stays 4-bit (W4A16 experts and dense MLPs), never measured
        self.memory = prefer == "memory"

    def row(self, names: list[str]) -> FormatRow | None:
        """The format row of `names` if all are quantized in one format with a row, else None."""
        kinds = {type(self.weights[n]) for n in names if n in self.weights}
        if len(kinds) != 1 or not all(n in self.weights for n in names):
            return None
        return TABLE.get(kinds.pop())

    def linear(
        self, names: list[str], fused_input: bool = True, w=None, norm: nn.Module | None = None
    ) -> nn.Module | None:
        """One linear over the stacked weights of `names` (or over `w`, a tied head's copy) in
        their format, if its row builds one; the names are then done. `norm`: the RMSNorm that
        feeds x, given the format's `norm_out` once the linear is installed."""
        row = TABLE.get(type(w)) if w is not None else self.row(names)
        if row is None or row.linear is None:
            return None
        ws = [w] if w is not None else [self.weights[n] for n in names]
        lin = row.linear(self, names, ws, fused_input)
        if lin is None:
            return None
        if w is None:  # a weight passed in (a tied head's copy) was never the loader's
            self.done += names
        if norm is not None and row.norm_out is not None:
            norm.impl = row.norm_out
        return lin

    def gated_mlp(self, prefix: str, mlp: nn.Module, producer: nn.Module | None) -> None:
        names = [f"{prefix}.{p}.weight" for p in PROJS]
        kinds = [type(self.weights[n]) for n in names if n in self.weights]
        row = TABLE.get(kinds[0]) if kinds else None
        if row is not None:
            self.done += (row.gated_mlp or generic_gated_mlp)(self, prefix, mlp, producer)

    def experts(self, prefix: str, experts: nn.Module, top_k: int) -> None:
        row = self.row([f"{prefix}.{p}" for p in experts.projs])
        if row is not None and row.experts is not None:
            self.done += row.experts(self, prefix, experts, top_k)

    def swap(self, parent: nn.Module, name: str, new: nn.Module | None) -> None:
        """parent.name = new (None: keep the old one), with the old module's forward hooks: tensor
        parallelism hangs its all-reduce on the row-parallel linears (distributed/shard.py)."""
        if new is None:
            return
        carry_hooks(getattr(parent, name), new)
        setattr(parent, name, new)

    def tied_head(self) -> object | None:
        """A tied LM head's copy in the format of the model's other weights (the embedding stays
        in the model dtype for the lookups; the head's GEMM reads the copy), or None."""
        head = self.model.lm_head
        if "lm_head.weight" in self.weights or not isinstance(head, nn.Linear):
            return None
        if head.weight.data_ptr() != self.model.embed_table.data_ptr():
            return None
        rows = [TABLE.get(type(w)) for w in self.weights.values()]
        row = next((r for r in rows if r is not None and r.tied_copy is not None), None)
        return None if row is None else row.tied_copy(head.weight.detach())


def _qkv(ins: Installer, attn: nn.Module, names: list[str], norm: nn.Module | None) -> None:
    """q|k|v as one linear into the attention's `qkv` slot (or its one stored projection), its
    input handed over by `norm` where the format's norm can (None: quantized before the GEMM)."""
    qkv = ins.linear(names, fused_input=norm is not None, norm=norm)
    if qkv is None:
        return
    if hasattr(attn, "query_key_value"):  # LLaDA2: one stored projection
        ins.swap(attn, "query_key_value", qkv)
        return
    set_slot(attn, "qkv", qkv)
    free(*(getattr(attn, f"{p}_proj") for p in "qkv" if getattr(attn, f"{p}_proj", None)))


def block_layers(ins: Installer) -> None:
    """QwenDLM / LLaDA2 layers: norm -> q|k|v, o, norm -> dense MLP or routed experts; the final
    norm -> the head. Each norm quantizes its output where its consumer's format takes that."""
    for i, layer in enumerate(ins.model.model.layers):
        prefix = f"model.layers.{i}"
        if hasattr(layer, "self_attn"):  # QwenDLM
            attn, p, o_name = layer.self_attn, f"{prefix}.self_attn", "o_proj"
            names = [f"{p}.{n}_proj.weight" for n in "qkv"]
        else:  # LLaDA2: query_key_value is already one linear
            attn, p, o_name = layer.attention, f"{prefix}.attention", "dense"
            names = [f"{p}.query_key_value.weight"]
        _qkv(ins, attn, names, layer.input_layernorm)
        ins.swap(attn, o_name, ins.linear([f"{p}.{o_name}.weight"], fused_input=False))
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            ins.experts(f"{prefix}.mlp.experts", mlp.experts, mlp.gate.top_k)
        else:
            ins.gated_mlp(f"{prefix}.mlp", mlp, layer.post_attention_layernorm)
    _head(ins, ins.model.model.norm)


def gemma_layers(ins: Installer) -> None:
    """DiffusionGemma: routed experts, q|k|v (full layers q|k) as one linear, o, and the dense
    GeGLU beside the experts; its norms are fused residual ops that do not quantize (the inputs
    are quantized before each GEMM)."""
    for i, layer in enumerate(ins.model.model.layers):
        prefix = f"model.layers.{i}"
        ins.experts(f"{prefix}.experts", layer.experts, layer.router.k)
        attn, p = layer.self_attn, f"{prefix}.self_attn"
        names = [f"{p}.{n}_proj.weight" for n in "qkv" if getattr(attn, f"{n}_proj") is not None]
        _qkv(ins, attn, names, None)
        ins.swap(attn, "o_proj", ins.linear([f"{p}.o_proj.weight"], fused_input=False))
        ins.gated_mlp(f"{prefix}.mlp", layer.mlp, None)
    _head(ins, None)


def _head(ins: Installer, norm: nn.Module | None) -> None:
    tied = ins.tied_head()
    head = ins.linear(["lm_head.weight"], fused_input=norm is not None, w=tied, norm=norm)
    ins.swap(ins.model, "lm_head", head)


def install_quantized(
    model: nn.Module,
    weights: dict,
    rows: int,
    walk: Callable[[Installer], None],
    emulate: bool = False,
    prefer: str = "speed",
) -> list[str]:
    """Install what runs quantized at the family's sites (`walk`), measured at `rows` block rows;
    `emulate`: W4A4 emulation (every all-NVFP4 dense MLP installed); `prefer`: "speed" (each
    choice measured) or "memory" (NVFP4 experts and dense MLPs on the W4A16 kernels, whatever
    the measurement). Returns the names left to dequantize."""
    ins = Installer(model, weights, rows, emulate, prefer)
    walk(ins)
    done = set(ins.done)
    return [n for n in weights if n not in done]


def generic_gated_mlp(
    ins: Installer, prefix: str, mlp: nn.Module, producer: nn.Module | None
) -> list[str]:
    """gate|up as one linear of the weights' format, the fused activation after it; down as
    another linear. Returns the names installed."""
    names = [f"{prefix}.{p}.weight" for p in PROJS]
    done: list[str] = []
    gate_up = ins.linear(names[:2], fused_input=producer is not None, norm=producer)
    if gate_up is not None:
        set_gate_up(mlp, QuantGateUp(gate_up, act_mul(mlp.activation)))
        done += names[:2]
    down = ins.linear(names[2:], fused_input=False)
    if down is not None:
        ins.swap(mlp, "down_proj", down)
        done += names[2:]
    return done
