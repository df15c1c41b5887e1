"""DiffusionGemma's step vocabulary: the three steps (LM head, `canvas_vocab`, the
self-conditioning GEMM p @ E) vs one stream over the vocabulary (kernels/canvas_vocab_pass.py).

python -m benchmarks.kernels.canvas_vocab_pass [--iters 50] [--rows 256] [--vocab 262144]
    [--hidden 2816] [--out results/canvas_vocab_pass_h100_DATE.json]

At the canvas's shape (256 rows, a tied bf16 262,144 x 2,816 head / embedding, softcap 30,
T = 0.8), every path replayed as a CUDA graph: the head alone (cuBLAS), the GEMM alone, the
three steps with the one-program and the split `canvas_vocab` (DLMRT_CANVAS_VOCAB=rows / split),
and the one pass (=onepass). Floors: bytes at the device's copy bandwidth (`common.PEAK_BYTES`)
and FLOPs at `common.PEAK_FLOPS`; each path's floor is the larger. The one pass's bytes: E once,
h, soft, the sample's partials (rows x V / 32 x 4 B, written and read) and the z scratch's final
write; the three steps add the logits (written, read twice), p (written, read) and E again. The
alternative that keeps the sample in a second pass over written logits (`logits_option_bytes`:
rows x V in bf16, written and read) is reported beside them. Not in the one pass's floor: its
z scratch, read and written per 128-entry chunk (rows x V / 128 x hidden x 8 B, ~11.8 GB at this
shape: L2 where it fits, HBM where not), the cost of kernels/vocab_pass.py's structure that this
benchmark measures (docs/kernels.md). Also: the one pass's agreement with
the three steps (argmax equal, share of equal samples, largest |soft difference| over the
largest |soft|).
"""

from __future__ import annotations

import torch

from benchmarks.common import PEAK_BYTES, PEAK_FLOPS, graph_ms, iters_parser, write_result

CAP, TEMPERATURE = 30.0, 0.8


def _inputs(rows: int, v: int, hidden: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator("cuda").manual_seed(0)
    h = torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    e = (torch.randn(v, hidden, device="cuda", generator=gen) * hidden**-0.5).to(torch.bfloat16)
    u = torch.rand(rows, device="cuda", generator=gen)
    return h, e, u, torch.tensor(TEMPERATURE, device="cuda")


def _bytes(rows: int, v: int, hidden: int) -> dict[str, float]:
    """Minimum HBM bytes per path (bf16 weights and activations)."""
    e = v * hidden * 2
    logits = rows * v * 2
    act = rows * hidden * 2 * 2  # h read, soft written
    partials = 2 * (rows * v // 32 * 4 + rows * (v // 128) * 4)
    return {
        "three_steps": 2 * e + 3 * logits + 2 * logits + act,  # head, canvas_vocab, GEMM
        "one_pass": e + act + partials,
        "logits_option_bytes": e + act + 2 * logits,  # the sample from written logits
    }


def run(rows: int, v: int, hidden: int, iters: int) -> dict:
    from dlmrt._kernels import canvas_vocab, canvas_vocab_pass, canvas_vocab_split

    h, e, u, t = _inputs(rows, v, hidden)
    raw = torch.empty(rows, v, dtype=torch.bfloat16, device="cuda")
    sc, soft = torch.empty_like(raw), torch.empty(rows, hidden, dtype=e.dtype, device="cuda")
    flops = 2 * rows * v * hidden  # one GEMM
    nbytes = _bytes(rows, v, hidden)

    def three(kernel) -> None:
        torch.matmul(h, e.t(), out=raw)
        kernel.canvas_vocab(raw, CAP, t, u, sc)
        torch.matmul(sc, e, out=soft)

    paths = {
        "head": (lambda: torch.matmul(h, e.t(), out=raw), v * hidden * 2 + rows * v * 2, flops),
        "gemm p @ E": (lambda: torch.matmul(sc, e, out=soft), v * hidden * 2 + rows * v * 2, flops),
        "three steps (rows)": (lambda: three(canvas_vocab), nbytes["three_steps"], 2 * flops),
        "three steps (split)": (
            lambda: three(canvas_vocab_split),
            nbytes["three_steps"],
            2 * flops,
        ),
        "one pass": (
            lambda: canvas_vocab_pass.canvas_vocab_pass(h, e, e, CAP, t, u, soft),
            nbytes["one_pass"],
            2 * flops,
        ),
    }
    out = []
    for name, (fn, b, f) in paths.items():
        floor = max(b / PEAK_BYTES, f / PEAK_FLOPS) * 1e3
        ms = graph_ms(fn, iters)
        out.append({"path": name, "ms": round(ms, 4), "floor_ms": round(floor, 4),
                    "x_floor": round(ms / floor, 2)})  # fmt: skip
    three(canvas_vocab)
    old, old_soft = canvas_vocab.canvas_vocab(raw, CAP, t, u, sc), soft.clone()
    new = canvas_vocab_pass.canvas_vocab_pass(h, e, e, CAP, t, u, soft)
    return {
        "rows": rows, "vocab": v, "hidden": hidden, "peak_bytes": PEAK_BYTES,
        "peak_flops": PEAK_FLOPS, "bytes": nbytes, "paths": out,
        "argmax_equal": bool(torch.equal(new[0], old[0])),
        "samples_equal": float((new[2] == old[2]).float().mean()),
        "soft_rel_diff": float((soft.float() - old_soft.float()).abs().max()
                               / old_soft.float().abs().max()),
    }  # fmt: skip


def main() -> None:
    ap = iters_parser(__doc__)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=262_144)
    ap.add_argument("--hidden", type=int, default=2816)
    args = ap.parse_args()
    result = run(args.rows, args.vocab, args.hidden, args.iters)
    for path in result["paths"]:
        print(
            f"{path['path']:>20}: {path['ms']:.4f} ms  (floor {path['floor_ms']:.4f} ms, "
            f"{path['x_floor']}x)"
        )
    print({k: v for k, v in result.items() if k != "paths"}, flush=True)
    if args.out:
        write_result(args.out, result, args.git_revision)


if __name__ == "__main__":
    main()
