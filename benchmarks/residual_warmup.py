"""Offline residual warm-up pilot (issue 17): teach a fresh ORL adapter to use the previous round.

    python benchmarks/residual_warmup.py --model BASE --out DIR [--steps 400] [--lr 0]
        [--adapter-lr 1e-3] [--rows 1024] [--task arithmetic_chain]
    dlmrt train eval --model DIR --task arithmetic_chain --problems 200 --max-new-tokens 256

The hypothesis (docs/orl-demo.md): ORL from a Base with no residual pathway starts from an
adapter that has never seen a residual, and a few hundred on-policy steps are too few to teach it;
the paper's QwenDLM starts from an adapter trained offline. One step here, per packed SFT row
(`dlmrt/train/data.py`, the Base's tokenizer and noise):

1. state k-1 = the SFT noise M0; a plain forward (z = 0: a block's first round), trained with CE
   on M0's masked rows (so the backbone keeps its round-0 skill; with --lr 0 it is frozen);
2. the threshold rule (--tau, 0.9) on that prediction: rows above tau take its argmax, the rest, M1,
   stay masked: state k, what the engine would see next;
3. z = softmax(logits_{k-1}) @ E at M1's rows (no gradient, as the engine's `soft_embedding`),
   injected through the adapter at M1's rows (`ResidualAdapter.inject`), CE on M1 (true tokens).

Every 10 steps the log also has M1's CE without z (the same state, no residual): what the
residual buys on the training states. The output is a QwenDLM checkpoint with the adapter
(`LLM(DIR, role="orl")`), fp32 weights.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from dlmrt import ops
from dlmrt.attention import AttnContext
from dlmrt.models.residual import soft_embedding
from dlmrt.train.data import SFTPacks
from dlmrt.train.export import save_tensors, write_json
from dlmrt.train.masks import attention_mask
from dlmrt.train.model import state_tensors
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.replay import replay_logits
from dlmrt.train.orl.start import start_model


def forward_with_z(model, ids, ctx, rows: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Logits of `rows` when those rows get the residual z: the ORL replay's forward
    (`dlmrt/train/orl/replay.py`) over a row whose noisy rows are `rows`, all unresolved."""
    unresolved = torch.ones(len(rows), dtype=torch.bool, device=ids.device)
    row = SimpleNamespace(ids=ids, positions=ctx.positions, noisy=rows, z=z, unresolved=unresolved)
    return replay_logits(model, row, ctx.mask)  # the fields of a PackedRow replay reads


def step_losses(model, batch, tau: float) -> dict[str, torch.Tensor]:
    """ce0 (state k-1, z = 0), ce1 (state k with z), the next state's rows and its inputs."""
    ctx = AttnContext(
        batch.positions, model.cfg.block_size, mask=attention_mask(batch.meta, "dense")
    )
    rows, labels = batch.loss_rows, batch.labels
    logits0 = model(batch.input_ids, ctx)[rows]
    ce0 = F.cross_entropy(logits0.float(), labels[rows])
    with torch.no_grad():
        conf, pred = torch.softmax(logits0.float(), -1).max(-1)
        accept = conf > tau
        z = soft_embedding(logits0.detach(), model.embed_table, model.adapter.cfg.temperature)
    ids1 = batch.input_ids.clone()
    ids1[rows[accept]] = pred[accept]
    rows1 = rows[~accept]
    if len(rows1):
        ce1 = F.cross_entropy(
            forward_with_z(model, ids1, ctx, rows1, z[~accept]).float(), labels[rows1]
        )
    else:
        ce1 = ce0 * 0
    return {"ce0": ce0, "ce1": ce1, "accepted": accept.float().mean(), "ids1": ids1,
            "rows1": rows1, "ctx": ctx}  # fmt: skip


def ce_without_z(model, out: dict, labels: torch.Tensor) -> float:
    """The next state's CE without the residual (no gradient)."""
    if not len(out["rows1"]):
        return 0.0
    with torch.no_grad():
        logits = model(out["ids1"], out["ctx"])[out["rows1"]]
    return F.cross_entropy(logits.float(), labels[out["rows1"]]).item()


def train(args: argparse.Namespace) -> Path:
    base, out = Path(args.model), Path(args.out)
    ops.use("torch")  # training runs the torch twins (no autograd through Triton)
    cfg = ORLConfig(model=str(base), task=args.task, seed=args.seed)
    model, raw = start_model(cfg, base, torch.device("cpu"))
    groups = [[p for n, p in model.named_parameters() if ("residual_adapter" in n) == a]
              for a in (False, True)]  # fmt: skip
    opt = torch.optim.AdamW([{"params": groups[0], "lr": args.lr},
                             {"params": groups[1], "lr": args.adapter_lr}],
                            betas=(0.9, 0.95), weight_decay=0.0)  # fmt: skip
    packs = SFTPacks(args.task, base, model.cfg.block_size, args.rows, 0.5, seed=args.seed + 7)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(out / "warmup_log.jsonl", "w") as log:
        for step in range(args.steps):
            batch = packs[step]
            losses = step_losses(model, batch, args.tau)
            (losses["ce0"] + losses["ce1"]).backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if step % 10 == 0 or step == args.steps - 1:
                line = {k: round(losses[k].item(), 5) for k in ("ce0", "ce1", "accepted")}
                line |= {"step": step, "ce1_without_z": round(ce_without_z(model, losses, batch.labels), 5),
                         "grad_norm": round(float(norm), 3), "seconds": round(time.time() - t0, 1)}  # fmt: skip
                log.write(json.dumps(line) + "\n")
                log.flush()
            opt.step()
            opt.zero_grad(set_to_none=True)
    save_tensors(state_tensors(model, torch.float32), out / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(base / name, out / name)
    write_json(out / "config.json", raw)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="Base checkpoint (QwenDLM format, no adapter)")
    ap.add_argument("--out", required=True, help="output checkpoint directory")
    ap.add_argument("--task", default="arithmetic_chain")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=0.0, help="backbone lr (0: frozen)")
    ap.add_argument("--adapter-lr", type=float, default=1e-3)
    ap.add_argument("--rows", type=int, default=1024, help="rows of a packed SFT row")
    ap.add_argument("--tau", type=float, default=0.9, help="the threshold rule's tau (step 2)")
    ap.add_argument("--seed", type=int, default=0)
    print("wrote", train(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
