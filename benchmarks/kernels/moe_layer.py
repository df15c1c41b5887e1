"""One MoE layer's routed experts (routing + expert MLP) at the real shapes, against the byte floor.

python -m benchmarks.kernels.moe_layer [--iters 50] [--out results/moe_layer_h200_DATE.json]

Shapes: LLaDA-2.1-mini (hidden 2048, 256 experts x 512, top-8, 32 rows, SwiGLU, sigmoid
group-limited routing 8 groups / top-4) and DiffusionGemma-26B-A4B (hidden 2816, 128 experts x
704, top-8, 256 rows, GeGLU, softmax routing). Random bf16 weights and activations; the router
logits are random, so the touched-expert count is what uniform routing gives (counted from the
routing itself). Modes: the torch twin (a loop over the active experts, host syncs), the CUDA ops
(Triton routing + grouped expert kernel), the CUDA ops replayed as one CUDA graph, and the same
routing with the experts on `torch._grouped_mm` (CUTLASS grouped GEMM; device-side sort; eager:
it copies from the host inside, so it cannot be captured) for comparison with ops eager.
Floor: max(FLOPs / 790 TFLOP/s, bytes / the device's copy bandwidth), bytes = the touched experts' weights plus the
router weight, activations in and out (negligible).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.common import (
    PEAK_BYTES,
    PEAK_FLOPS,
    command_line,
    cuda_time,
    iters_parser,
    write_result,
)
from dlmrt import capture_guard, ops
from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini
from dlmrt.ops import reference


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    experts: int
    inter: int
    top_k: int
    rows: int
    activation: str  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    n_group: int = 0  # > 0: LLaDA's sigmoid group-limited routing


def _model_shapes() -> tuple[Shape, Shape]:
    """LLaDA-2.1-mini's and DiffusionGemma-26B-A4B's MoE layer at a round's / canvas's rows."""
    ll, dg = llada21_mini(), diffusion_gemma_26b()
    return (
        Shape("llada2.1-mini", ll.hidden_size, ll.num_experts, ll.moe_intermediate_size,
              ll.top_k, ll.block_size, "silu", n_group=ll.n_group),
        Shape("diffusiongemma-26b-a4b", dg.hidden_size, dg.num_experts, dg.moe_intermediate_size,
              dg.top_k_experts, dg.canvas_length, "gelu_tanh"),
    )  # fmt: skip


SHAPES = _model_shapes()


def floor_ms(shape: Shape, index: torch.Tensor, bytes_per: int = 2) -> tuple[float, int]:
    """(floor in ms, touched experts) for one layer's routed experts under `index` [rows, k]."""
    touched = int(torch.unique(index).numel())
    expert_params = 3 * shape.hidden * shape.inter
    weight_bytes = (touched * expert_params + shape.experts * shape.hidden) * bytes_per
    flops = 2 * index.numel() * expert_params + 2 * shape.rows * shape.hidden * shape.experts
    return max(flops / PEAK_FLOPS, weight_bytes / PEAK_BYTES) * 1e3, touched


def make_layer(shape: Shape, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    gen = torch.Generator(device).manual_seed(0)

    def rand(*size: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*size, generator=gen, device=device) * std).to(dtype)

    x = rand(shape.rows, shape.hidden, std=1.0)
    router = rand(shape.experts, shape.hidden)
    gate_up = rand(shape.experts, 2 * shape.inter, shape.hidden)
    down = rand(shape.experts, shape.hidden, shape.inter)
    bias = torch.zeros(shape.experts, device=device)
    scale = torch.ones(shape.experts, device=device)

    def route(mod) -> tuple[torch.Tensor, torch.Tensor]:
        if shape.n_group:  # LLaDA: the router runs in fp32
            logits = (x.float() @ router.float().T).contiguous()
            return mod.moe_route_grouped(logits, bias, shape.n_group, 4, shape.top_k, True, 2.5)
        logits = (x @ router.T).contiguous()  # DiffusionGemma: `proj` in the model dtype
        return mod.moe_route_softmax(logits, scale, shape.top_k)

    def layer(mod, parts: bool = False):
        if parts:  # the raw tensors, for other expert implementations
            return None, None, x, gate_up, down
        w, idx = route(mod)
        return mod.moe_mlp(x, w, idx, gate_up, down, shape.activation)

    return layer, route


def sort_by_expert(index: torch.Tensor, experts: int):
    """(order, offs, src) of the (row, slot) pairs sorted by expert on the device: `order` the
    pairs' flat indices in expert order, `offs` each expert's end offset (int32, the grouped GEMMs'
    `offs`), `src` each sorted pair's row. No host sync."""
    flat = index.flatten()
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=experts), 0).to(torch.int32)
    return order, offs, order // index.shape[1]


def glu(h: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up of a fused [gate | up] projection: SwiGLU ("silu") or GeGLU (tanh gelu)."""
    gate, up = h.chunk(2, dim=-1)
    return (F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")) * up


def grouped_mm_experts(x, weights, index, gate_up_t, down_t, activation: str) -> torch.Tensor:
    """The experts on torch._grouped_mm: pairs sorted by expert on the device, two grouped GEMMs,
    the activation, routing weights, scatter-add back (no host sync)."""
    order, offs, src = sort_by_expert(index, gate_up_t.shape[0])
    h = torch._grouped_mm(x[src], gate_up_t, offs=offs)
    y = torch._grouped_mm(glu(h, activation), down_t, offs=offs)
    y = y * weights.flatten()[order, None].to(x.dtype)
    return torch.zeros_like(x).index_add_(0, src, y)


def bench_grouped_mm(shape: Shape, layer, route, iters: int, ref: torch.Tensor) -> dict:
    """ms of routing + `grouped_mm_experts` (eager) and its error vs the twin."""
    _, _, x, gate_up, down = layer(None, parts=True)
    gu_t, down_t = gate_up.transpose(1, 2), down.transpose(1, 2)

    def run() -> torch.Tensor:
        w, idx = route(ops)
        return grouped_mm_experts(x, w, idx, gu_t, down_t, shape.activation)

    try:
        run()
    except RuntimeError:  # a layout _grouped_mm refuses: give it contiguous [E, K, N] copies
        gu_t, down_t = gu_t.contiguous(), down_t.contiguous()
    try:
        out = run()
        # eager: _grouped_mm copies from the host inside (not capturable in torch 2.11)
        ms = cuda_time(run, iters) * 1e3
    except RuntimeError as e:
        return {"grouped_mm_error": str(e).splitlines()[0][:200]}
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    return {"grouped_mm_eager_ms": round(ms, 4), "grouped_mm_max_rel_err_vs_twin": err}


def bench(shape: Shape, iters: int) -> dict:
    layer, route = make_layer(shape, torch.device("cuda"))
    _, index = route(reference)
    floor, touched = floor_ms(shape, index)
    out = {"shape": shape.name, "rows": shape.rows, "touched_experts": touched}
    out["floor_ms"] = round(floor, 4)
    out["twin_ms"] = cuda_time(lambda: layer(reference), iters) * 1e3
    out["ops_eager_ms"] = cuda_time(lambda: layer(ops), iters) * 1e3
    static = layer(ops)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(ops)  # warm-up (Triton compiles) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with capture_guard.graph(graph):
        static = layer(ops)
    out["ops_graph_ms"] = cuda_time(graph.replay, iters) * 1e3
    out["graph_equals_eager"] = bool(torch.equal(static, layer(ops)))
    ref = layer(reference).float()
    out["max_rel_err_vs_twin"] = float((static.float() - ref).abs().max() / ref.abs().max())
    for key in ("twin_ms", "ops_eager_ms", "ops_graph_ms"):
        out[key] = round(out[key], 4)
    out["graph_ratio_to_floor"] = round(out["ops_graph_ms"] / floor, 2)
    out |= bench_grouped_mm(shape, layer, route, iters, ref)
    return out


def main() -> None:
    args = iters_parser(__doc__).parse_args()
    rows = []
    with torch.inference_mode():
        for shape in SHAPES:
            rows.append(bench(shape, args.iters))
            r = rows[-1]
            print(
                f"{r['shape']:>24}  touched {r['touched_experts']:>3}  floor {r['floor_ms']:.3f} ms  "
                f"twin {r['twin_ms']:.3f}  ops {r['ops_eager_ms']:.3f}  graph {r['ops_graph_ms']:.3f} "
                f"({r['graph_ratio_to_floor']}x floor)  graph==eager {r['graph_equals_eager']}  "
                f"grouped_mm {r.get('grouped_mm_eager_ms', r.get('grouped_mm_error'))}"
            )
    if args.out:
        write_result(
            args.out,
            {"benchmark": "moe_layer", "command": command_line(), "results": rows},
            args.git_revision,
        )


if __name__ == "__main__":
    main()
