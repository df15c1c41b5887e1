"""DiffusionGemma's vocabulary pass: one program per canvas row vs the row's vocabulary in splits.

python -m benchmarks.kernels.canvas_vocab_split [--iters 50] [--rows 256] [--vocab 262144]
    [--splits 1,2,4,8,16,32] [--out results/canvas_vocab_split_h100_DATE.json]

At the canvas's shape (256 rows x 262,144, the LM head's bf16 output, softcap 30, T = 0.8), every
path replayed as a CUDA graph: `kernels/canvas_vocab.py` (DLMRT_CANVAS_VOCAB=rows, one program a
row), `kernels/canvas_vocab_split.py` at the split count `launch_shape` picks from the SM count
(DLMRT_CANVAS_VOCAB=split) and at each count of --splits (to retune PROGRAMS_PER_SM), and the torch
twin. Reports ms per call, the byte floor (the logits read twice, the self-conditioning
probabilities written once, at the device's copy bandwidth `common.PEAK_BYTES`), each path's ratio
to it, and the split kernel's agreement with the one-program kernel (argmax equal, share of equal
samples, max entropy difference).
"""

from __future__ import annotations

import torch

from benchmarks.common import PEAK_BYTES, graph_ms, iters_parser, write_result
from dlmrt.ops import vocab

CAP, TEMPERATURE = 30.0, 0.8


def _inputs(rows: int, v: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator("cuda").manual_seed(0)
    raw = (3 * torch.randn(rows, v, device="cuda", generator=gen)).to(torch.bfloat16)
    u = torch.rand(rows, device="cuda", generator=gen)
    t = torch.tensor(TEMPERATURE, device="cuda")
    return raw, t, u, torch.empty_like(raw)


def _case(name: str, fn, floor_ms: float, iters: int) -> dict:
    ms = graph_ms(fn, iters)
    return {"path": name, "ms": round(ms, 4), "x_floor": round(ms / floor_ms, 2)}


def run(rows: int, v: int, sweep: list[int], iters: int) -> dict:
    """Every path at [rows, v]; the agreement of the default split kernel with the row kernel."""
    from dlmrt._kernels import canvas_vocab, canvas_vocab_split

    raw, t, u, sc = _inputs(rows, v)
    floor_bytes = 2 * raw.numel() * raw.element_size() + sc.numel() * sc.element_size()
    floor_ms = floor_bytes / PEAK_BYTES * 1e3
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits, span = canvas_vocab_split.launch_shape(rows, v, sms, canvas_vocab.BLOCK)
    paths = [
        _case("rows", lambda: canvas_vocab.canvas_vocab(raw, CAP, t, u, sc), floor_ms, iters),
        _case(
            f"split (default: {splits})",
            lambda: canvas_vocab_split.canvas_vocab(raw, CAP, t, u, sc),
            floor_ms,
            iters,
        ),
    ]
    for n in sweep:
        fn = lambda n=n: canvas_vocab_split.canvas_vocab(raw, CAP, t, u, sc, splits=n)  # noqa: E731
        paths.append(_case(f"split {n}", fn, floor_ms, iters))
    paths.append(_case("twin", lambda: vocab.canvas_vocab(raw, CAP, t, u, sc), floor_ms, iters))
    old = canvas_vocab.canvas_vocab(raw, CAP, t, u, sc)
    new = canvas_vocab_split.canvas_vocab(raw, CAP, t, u, torch.empty_like(sc))
    return {
        "rows": rows, "vocab": v, "sms": sms, "default_splits": splits, "span": span,
        "floor_ms": round(floor_ms, 4), "paths": paths,
        "argmax_equal": bool(torch.equal(new[0], old[0])),
        "samples_equal": float((new[2] == old[2]).float().mean()),
        "max_entropy_diff": float((new[1] - old[1]).abs().max()),
    }  # fmt: skip


def main() -> None:
    ap = iters_parser(__doc__)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=262_144)
    ap.add_argument("--splits", default="1,2,4,8,16,32", help="split counts to sweep")
    args = ap.parse_args()
    sweep = [int(s) for s in args.splits.split(",") if s]
    result = run(args.rows, args.vocab, sweep, args.iters)
    for path in result["paths"]:
        print(f"{path['path']:>20}: {path['ms']:.4f} ms  ({path['x_floor']}x the floor)")
    print({k: v for k, v in result.items() if k != "paths"}, flush=True)
    if args.out:
        write_result(args.out, result, args.git_revision)


if __name__ == "__main__":
    main()
