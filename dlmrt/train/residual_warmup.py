"""Offline residual warm-up (`dlmrt train residual`): teach a model's ORL adapter to use the
previous round before any on-policy step (issue 39; docs/orl-training.md).

ORL from an adapter that has never seen a residual trains its backbone only: with W_d = 0, W_g and
W_u get exactly zero gradient, and a few hundred on-policy steps leave the adapter's output at
~1e-5 of the embedding's size (`dlmrt train eval --adapter off` gives the same tokens). The
paper's QwenDLM starts ORL from an adapter trained offline until the model uses it (residual
ratio ~0.9). One step here, per packed SFT row (`dlmrt/train/data.py`: the Base's tokenizer and
SFT noise M0):

1. pass 1 on M0 with z = 0 (a block's first round): CE on M0's rows;
2. per noisy block, the n lowest-entropy rows of M0 accept pass 1's argmax, n ~ U{0 .. |M0_b| - 1}
   (what an `entropy_budget` round of some budget would accept; at least one row stays masked);
   the rest, M1, is state k, what the engine would see next;
3. pass 2 on state k with z = softmax(logits_1) E at M1's rows (`soft_embedding`, no gradient, as
   the engine computes it), injected by the adapter (the ORL replay's forward): CE on M1;
4. with `passes` > 1, steps 2-3 again from pass 2 (its logits had z): the engine's later rounds,
   where z comes from a forward that itself had z (docs/orl-demo.md: a warm-up on pass 1's z alone
   learns a residual that costs accuracy when the model decodes).

Loss ce_1 + ce_2; backbone and adapter trained together (the adapter in its own AdamW group: its
lr and a small eps, since its second moments start far below Adam's default 1e-8). A fresh adapter
(the Base has none) starts with W_d ~ N(0, `down_init_std`), off the bilinear dead zone of W_d = 0,
and with the post-norm form when `post_norm_scale` is set. Every pass runs the noisy rows through
the adapter's injection (z = 0 where a row has none), as every row of the engine's block is: the
same as the plain forward without a post-norm, and the engine's input with one.
`log.jsonl` every `log_every` steps: ce_1, ce_2, ce_2 without z (the same state, no residual: what
the residual buys), the share accepted, and the residual ratio RMS(alpha g(z)) / RMS(E[x]) on M1.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from dlmrt.attention import AttnContext
from dlmrt.models.residual import soft_embedding
from dlmrt.train.residual_config import WarmupConfig

GROUP_STRIDE = 1 << 20  # (doc, block) -> one key: doc * stride + block (blocks per doc < stride)


def accept_lowest_entropy(
    entropy: torch.Tensor, group: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """[M] bool: per group (a noisy block's masked rows), its n lowest-entropy rows, n drawn
    uniformly from 0 .. size - 1 (so at least one row of every group stays masked)."""
    by_entropy = torch.argsort(entropy, stable=True)
    order = by_entropy[torch.argsort(group[by_entropy], stable=True)]  # by group, then entropy
    keys, sizes = torch.unique_consecutive(group[order], return_counts=True)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.arange(len(order)) - torch.repeat_interleave(starts, sizes)
    u = torch.rand(len(keys), generator=generator)
    n = (u * sizes).long()  # U{0 .. size - 1}
    accept = torch.zeros(len(entropy), dtype=torch.bool)
    accept[order] = rank < torch.repeat_interleave(n, sizes)
    return accept


def _block_logits(model, ids, ctx, noisy: torch.Tensor, live: torch.Tensor, z=None):
    """Logits of the `live` rows (still masked) when the noisy copies' rows `noisy` are the
    blocks being denoised and `live` gets the residual z (None: z = 0, a block's first round):
    the ORL replay's forward. Every noisy row goes through `ResidualAdapter.inject`, as every
    row of the engine's block does: with a post-norm that rescales the resolved rows too."""
    from dlmrt.train.orl.replay import replay_logits

    slot = torch.full((len(ids),), -1, dtype=torch.long, device=ids.device)
    slot[noisy] = torch.arange(len(noisy), device=ids.device)
    slot = slot[live]
    unresolved = torch.zeros(len(noisy), dtype=torch.bool, device=ids.device)
    unresolved[slot] = True
    z_rows = torch.zeros(len(noisy), model.embed_table.shape[1], device=ids.device)
    if z is not None:
        z_rows[slot] = z.to(z_rows.dtype)
    row = SimpleNamespace(
        ids=ids, positions=ctx.positions, noisy=noisy, z=z_rows, unresolved=unresolved
    )
    return replay_logits(model, row, ctx.mask)[slot]


def step_losses(model, batch, generator: torch.Generator, passes: int = 1) -> dict:
    """ce1 (pass 1, z = 0), loss2 (the mean CE over the `passes` passes with z), ce2 (the last
    one's) and what the log reads. Each pass with z starts from the previous pass: its
    lowest-entropy rows accepted, z from its logits at the rest. With passes > 1 a z comes from
    logits that themselves had z, as in the engine's later rounds."""
    from dlmrt.train.masks import attention_mask

    mask = attention_mask(batch.meta, "dense")
    ctx = AttnContext(batch.positions, model.cfg.block_size, mask=mask)
    live, labels = batch.loss_rows, batch.labels  # live: the rows still masked
    noisy = batch.meta.noisy.nonzero().flatten()
    logits = _block_logits(model, batch.input_ids, ctx, noisy, live).float()
    ce1, ids, z = F.cross_entropy(logits, labels[live]), batch.input_ids, None
    with_z = []  # per pass: its CE with z
    group = batch.meta.doc[live].long() * GROUP_STRIDE + batch.meta.block[live].long()
    for _ in range(passes):
        with torch.no_grad():
            logp = torch.log_softmax(logits, -1)
            entropy = -(logp.exp() * logp).sum(-1)
            accept = accept_lowest_entropy(entropy.cpu(), group.cpu(), generator).to(live.device)
            z = soft_embedding(logits, model.embed_table, model.adapter.cfg.temperature)[~accept]
            if not with_z:  # the log's share: of pass 1's rows (M0)
                accepted = accept.float().mean()
        ids = ids.clone()
        ids[live[accept]] = logits.argmax(-1)[accept]
        live, group = live[~accept], group[~accept]  # never empty: every block keeps a row
        logits = _block_logits(model, ids, ctx, noisy, live, z).float()
        with_z.append(F.cross_entropy(logits, labels[live]))
    return {
        "ce1": ce1,
        "ce2": with_z[-1],  # the log compares it with the same state without z
        "loss2": sum(with_z) / passes,
        "accepted": accepted,
        "ids2": ids,
        "rows2": live,
        "z": z,
        "ctx": ctx,
        "noisy": noisy,
    }


@torch.no_grad()
def diagnostics(model, out: dict, labels: torch.Tensor) -> dict[str, float]:
    """ce2 without z (the same state, no residual) and the residual ratio on M1."""
    logits = _block_logits(model, out["ids2"], out["ctx"], out["noisy"], out["rows2"])
    adapter = model.adapter
    g = adapter.cfg.strength * adapter(out["z"].to(model.embed_table.dtype))
    emb = model.embed_table[out["ids2"][out["rows2"]]]
    ratio = (g.float().pow(2).sum() / emb.float().pow(2).sum().clamp_min(1e-30)).sqrt()
    ce = F.cross_entropy(logits.float(), labels[out["rows2"]])
    return {"ce2_without_z": round(ce.item(), 5), "residual_ratio": float(f"{ratio.item():.4g}")}


def _optimizer(model: torch.nn.Module, cfg: WarmupConfig) -> torch.optim.AdamW:
    """AdamW over the backbone and, in its own group (its lr, a small eps), the adapter."""
    is_adapter = [("residual_adapter" in n, p) for n, p in model.named_parameters()]
    return torch.optim.AdamW(
        [
            {"params": [p for a, p in is_adapter if not a], "lr": cfg.lr},
            {
                "params": [p for a, p in is_adapter if a],
                "lr": cfg.adapter_lr,
                "eps": cfg.adapter_adam_eps,
            },
        ],
        betas=(0.9, 0.95),
        weight_decay=0.0,
    )


def train(cfg: WarmupConfig, out: Path) -> Path:
    """Warm the adapter up; `out` becomes an ORL checkpoint (fp32) with `log.jsonl`."""
    from dlmrt import ops
    from dlmrt.demo import demo_model_path
    from dlmrt.train.data import SFTPacks
    from dlmrt.train.export import save_tensors, write_json
    from dlmrt.train.model import state_tensors
    from dlmrt.train.orl.config import ORLConfig
    from dlmrt.train.orl.start import read_config, start_model
    from dlmrt.train.trainer import resolve_device

    base = Path(cfg.model) if cfg.model else demo_model_path()
    ops.use("torch")  # training runs the torch twins (no autograd through Triton)
    device = resolve_device(cfg.device)
    fresh = "orl_residual" not in read_config(base)
    start = ORLConfig(
        model=str(base), task=cfg.task, seed=cfg.seed, adapter_post_norm_scale=cfg.post_norm_scale
    )
    model, raw = start_model(start, base, device)
    if fresh and cfg.down_init_std > 0:
        with torch.no_grad():  # drawn on the host: the same init on every device
            gen = torch.Generator().manual_seed(cfg.seed + 1)
            w = model.adapter.down_proj.weight
            w.copy_(torch.randn(w.shape, generator=gen) * cfg.down_init_std)
    opt = _optimizer(model, cfg)
    packs = SFTPacks(cfg.task, base, model.cfg.block_size, cfg.rows, 0.5, seed=cfg.seed + 7)
    gen, t0 = torch.Generator().manual_seed(cfg.seed), time.time()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "warmup_config.json", {k: getattr(cfg, k) for k in cfg.__dataclass_fields__})
    with open(out / "log.jsonl", "w") as log:
        for step in range(cfg.steps):
            batch = packs[step].to(device)
            losses = step_losses(model, batch, gen, cfg.passes)
            (losses["ce1"] + losses["loss2"]).backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                line = {"step": step} | {
                    k: round(losses[k].item(), 5) for k in ("ce1", "ce2", "accepted")
                }
                line |= diagnostics(model, losses, batch.labels)
                line |= {"grad_norm": round(float(norm), 3), "seconds": round(time.time() - t0, 1)}
                log.write(json.dumps(line) + "\n")
                log.flush()
            opt.step()
            opt.zero_grad(set_to_none=True)
    save_tensors(state_tensors(model, torch.float32), out / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(base / name, out / name)
    write_json(out / "config.json", raw)
    return out
