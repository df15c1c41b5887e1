"""ORL replay step time: packed rows + FlexAttention staircase vs replaying states one by one.

    python -m benchmarks.orl.orl_replay [--layers 12] [--rollouts 8] [--new-tokens 2048]
        [--rounds 20] [--pack-tokens 16384] [--out benchmarks/results/orl_replay.json]

QwenDLM-4B shape (`--layers` of its 36: a 16k-token row's activations fit with fp32 master
weights and grads), random weights, bf16 autocast as in `train_orl`. Synthetic verified rollouts
of `--rounds` rounds per 256-token block (random canvases and z): each block selects the 25% of
rounds plus its final one, as the trainer does. Both variants compute the same loss (CE + AEC,
`dlmrt/train/orl/losses.py`) forward + backward over the same states:
  packed     documents = (response, slicing step) with the clean context once, first-fit into rows
             of `--pack-tokens`, one flex_attention forward per row (invisible tiles skipped)
  one_by_one each state alone: its clean context + its noisy block, one forward each (flex; and
             `--dense` also times the dense-mask SDPA twin)
The target (issue 16): packed >= 4x faster than one by one (the paper: 3.5-5.2x).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import write_result
from dlmrt import ops
from dlmrt.model_shapes import qwen_dlm_4b
from dlmrt.models.qwen_dlm import QwenDLM
from dlmrt.train.masks import FLEX_TILE, attention_mask
from dlmrt.train.orl.capture import Rollout, State
from dlmrt.train.orl.losses import LossSpec, combine, row_terms
from dlmrt.train.orl.plan import Doc, pack_docs, plan
from dlmrt.train.orl.replay import replay_logits
from dlmrt.train.orl.row import build_row, flex_length

L = 256


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pack-tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dense", action="store_true", help="also one by one with the dense mask")
    ap.add_argument("--out", default="benchmarks/results/orl_replay.json")
    ap.add_argument("--git-revision", default=None)
    return ap.parse_args()


def _model(layers: int) -> QwenDLM:
    with torch.device("meta"):
        model = QwenDLM(qwen_dlm_4b(layers))
    model = model.to_empty(device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.tie_lm_head()
    return model.train()


def _rollout(args, i: int, vocab: int, hidden: int) -> Rollout:
    g = torch.Generator(device="cuda").manual_seed(i)
    p, n = args.prompt_tokens, args.new_tokens
    states = []
    for b in range(p // L, (p + n + L - 1) // L):
        for k in range(args.rounds):
            unres = torch.arange(L, device="cuda") >= k * L // args.rounds
            canvas = torch.randint(0, vocab, (L,), device="cuda", generator=g)
            z = torch.randn(L, hidden, device="cuda", generator=g, dtype=torch.bfloat16)
            ent = torch.rand(L, device="cuda", generator=g) * 0.2
            acc = torch.randint(0, 2, (L,), device="cuda", generator=g).bool()
            states.append(State(b, k, canvas, unres, z, ent, acc))
    ids = torch.randint(0, vocab, (p + n,), generator=torch.Generator().manual_seed(i)).tolist()
    return Rollout(i, ids[:p], ids[p:], "", 0, states, len(states), verified=True)


def _time(model, rows_of_docs, p, spec, attention: str, repeats: int) -> float:
    def step():
        for docs in rows_of_docs:
            n = flex_length(sum(d.length for d in docs), FLEX_TILE)  # the trainer's buckets
            row = build_row(docs, model.cfg.vocab_size, torch.device("cuda"), length=n)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = replay_logits(model, row, attention_mask(row.meta, attention))
                loss = combine(row_terms(logits, None, row, spec), p.responses, p.aec_den, spec)[0]
            loss.backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up: flex compilation, allocator
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return min(times)


def main() -> None:
    args = _args()
    ops.use("torch")  # training runs the torch twins (Triton kernels have no autograd)
    model = _model(args.layers)
    cfg = model.cfg
    rs = [_rollout(args, i, cfg.vocab_size, cfg.hidden_size) for i in range(args.rollouts)]
    p = plan(rs, 0.25, 0.2, cfg.vocab_size)
    spec = LossSpec(1.0, 0.2, 1.0, False, 0.1, 5.0)
    packed_rows = pack_docs(p.docs, args.pack_tokens)
    singles = [
        [Doc(d.rollout, [s], d.token_weight, [t])]
        for d in p.docs
        for s, t in zip(d.states, d.targets)
    ]
    result = {
        "states": p.states,
        "docs": len(p.docs),
        "packed_rows": len(packed_rows),
        "packed_tokens": sum(d.length for d in p.docs),
        "one_by_one_tokens": sum(d[0].length for d in singles),
    }
    result["packed_flex_s"] = _time(model, packed_rows, p, spec, "flex", args.repeats)
    result["one_by_one_flex_s"] = _time(model, singles, p, spec, "flex", args.repeats)
    result["speedup_vs_one_by_one_flex"] = result["one_by_one_flex_s"] / result["packed_flex_s"]
    if args.dense:
        result["one_by_one_dense_s"] = _time(model, singles, p, spec, "dense", args.repeats)
        result["speedup_vs_one_by_one_dense"] = (
            result["one_by_one_dense_s"] / result["packed_flex_s"]
        )
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()})
    write_result(
        args.out,
        {"benchmark": "orl_replay", "config": vars(args), **result, "target_speedup": 4.0},
        args.git_revision,
    )


if __name__ == "__main__":
    main()
