"""The shapes the DeepGEMM benchmark runs: every dense projection of the three families (N, K),
at the family's block rows and 1 / 7 rows (a sanity pair), and each MoE family's routed experts
(`benchmarks/kernels/moe_layer.py`'s shapes). All derived from `dlmrt/model_shapes.py`."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.kernels.fp8_gemm import gemm_shapes
from benchmarks.kernels.moe_layer import SHAPES as EXPERT_SHAPES
from benchmarks.kernels.moe_layer import Shape
from dlmrt.model_shapes import llada21_mini

# Rows of one round / step: QwenDLM's and DiffusionGemma's 256-row blocks / canvas, LLaDA's 32.
FAMILY_ROWS = {"qwen_dlm": 256, "llada2": 32, "diffusion_gemma": 256}
SANITY_ROWS = (1, 7)
# moe_layer.py's shape names -> the family keys above
EXPERT_FAMILY = {"llada2.1-mini": "llada2", "diffusiongemma-26b-a4b": "diffusion_gemma"}


@dataclass(frozen=True)
class Dense:
    """One dense projection: x [rows, k] @ w [n, k]^T."""

    family: str
    name: str  # "<family>.<projection>"
    n: int
    k: int


def llada_shapes() -> dict[str, tuple[int, int]]:
    """(N, K) of LLaDA-2.1-mini's dense GEMMs: q|k|v, o, layer 0's dense MLP, the shared expert's
    MLP (its one shared expert), the LM head (the router, 256 x 2048 in fp32, is left out)."""
    c = llada21_mini()
    h, shared = c.hidden_size, c.moe_intermediate_size * c.num_shared_experts
    return {
        "llada2.qkv": (c.q_size + 2 * c.kv_size, h), "llada2.o": (h, c.q_size),
        "llada2.gate_up": (2 * c.intermediate_size, h), "llada2.down": (h, c.intermediate_size),
        "llada2.shared_gate_up": (2 * shared, h), "llada2.shared_down": (h, shared),
        "llada2.lm_head": (c.vocab_size, h),
    }  # fmt: skip


def dense_shapes() -> list[Dense]:
    """Every dense projection of QwenDLM-4B, LLaDA-2.1-mini and DiffusionGemma-26B-A4B."""
    table = gemm_shapes() | llada_shapes()
    return [Dense(name.split(".")[0], name, n, k) for name, (n, k) in table.items()]


def dense_rows(shape: Dense, rows: list[int] | None) -> list[int]:
    """The row counts a dense shape runs at: `rows` if given, else its family's and the sanity
    pair."""
    return list(rows) if rows else [FAMILY_ROWS[shape.family], *SANITY_ROWS]


def expert_shapes() -> list[tuple[str, Shape]]:
    """(family, shape) of each MoE family's routed experts at its block rows."""
    return [(EXPERT_FAMILY[s.name], s) for s in EXPERT_SHAPES]
