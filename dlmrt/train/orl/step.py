"""One ORL step after the rollouts: plan -> packed replay -> losses -> one optimizer step."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from dlmrt.train.masks import FLEX_TILE, attention_mask
from dlmrt.train.orl import dist
from dlmrt.train.orl.balance import share
from dlmrt.train.orl.capture import Rollout
from dlmrt.train.orl.config import ORLConfig
from dlmrt.train.orl.losses import LossSpec, combine, row_terms
from dlmrt.train.orl.plan import Doc, Target, pack_docs, plan
from dlmrt.train.orl.replay import replay_logits
from dlmrt.train.orl.residual_probe import ResidualProbe
from dlmrt.train.orl.row import PackedRow, build_row, flex_length
from dlmrt.train.orl.selection import select_rounds


@dataclass
class Replayer:
    cfg: ORLConfig
    model: torch.nn.Module
    device: torch.device
    attention: str  # flex | dense
    bf16: bool
    rank_world: tuple[int, int] = (0, 1)

    @property
    def spec(self) -> LossSpec:
        c = self.cfg
        return LossSpec(c.temperature, c.aec_rho, c.aec_weight, c.entropy_gate, c.zeta, c.rkl_cap)

    def autocast(self):
        if not self.bf16:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def losses(self, rollouts: list[Rollout], probe: ResidualProbe | None = None) -> dict[str, Any]:
        """Backward of this rank's share of the step's loss; the step's global statistics. With
        `probe`: also the residual-to-embedding ratio of the replayed rows, and the probe keeps a
        sample of them for `optimizer_step`'s output update."""
        cfg, vocab = self.cfg, self.model.cfg.vocab_size
        p = plan(rollouts, cfg.select_fraction, cfg.aec_gate, vocab)
        verified = sum(r.verified for r in rollouts)
        tokens = sum(len(r.token_ids) for r in rollouts)
        forwards = sum(r.forwards for r in rollouts)
        responses, aec_den, n_rollouts, verified, states, pairs, tokens, forwards = dist.all_sum(
            [p.responses, p.aec_den, len(rollouts), verified, p.states, p.pairs, tokens, forwards],
            self.device,
        )
        stats = {
            "rollouts": n_rollouts,
            "verified": verified,
            "reward": verified / n_rollouts,
            "states": states,
            "pairs": pairs,
            "rollout_tokens": tokens,
            "rollout_tpf": tokens / max(forwards, 1),
        }
        mine = share(p.docs, *self.rank_world) if responses > 0 else []
        if probe is not None:
            probe.keep_rows([s for d in mine for s in d.states])
        sums, diag, replay_tokens = self._replay(mine, responses, aec_den, probe)
        loss, ce, rkl, aec, gated, active, h_src, h_next, replay_tokens = dist.all_sum(
            [*sums.tolist(), *diag.tolist(), replay_tokens], self.device
        )
        n = max(gated, 1)
        aec_stats = {
            "aec_pairs_gated": gated,
            "aec_active_share": active / n,
            "aec_h_source": h_src / n,
            "aec_h_next": h_next / n,
        }
        residual = probe.ratio() if probe is not None else {}
        return {
            **stats,
            "replay_tokens": replay_tokens,
            "loss": loss,
            "ce": ce,
            "rkl": rkl,
            "aec": aec,
            "responses": responses,
            **aec_stats,
            **residual,
        }

    def _replay(
        self, mine: list[Doc], responses: float, aec_den: float, probe: ResidualProbe | None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Replay this rank's documents a packed row at a time, backward of each row's loss; (the
        sums of loss, ce, rkl, aec; the AEC pairs' count, active, H_source, H_next; tokens)."""
        sums = torch.zeros(4, device=self.device)  # loss, ce, rkl, aec
        diag = torch.zeros(4, device=self.device)  # AEC pairs: count, active, H_source, H_next
        replay_tokens = 0
        for docs in pack_docs(mine, self.cfg.pack_tokens):
            row = self.row(docs)
            with self.autocast():
                mask = attention_mask(row.meta, self.attention)
                logits = replay_logits(self.model, row, mask, probe)
                nums = row_terms(logits, logits.detach(), row, self.spec)
                loss, parts = combine(nums, responses, aec_den, self.spec)
            loss.backward()
            sums += torch.stack([loss, parts["ce"], parts["rkl"], parts["aec"]]).detach().float()
            diag += nums["aec_diag"].float()
            replay_tokens += row.num_tokens
        return sums, diag, replay_tokens

    def row(self, docs: list[Doc]) -> PackedRow:
        """The packed row; flex rows padded to a power-of-two number of tiles (few shapes)."""
        vocab = self.model.cfg.vocab_size
        if self.attention != "flex":
            return build_row(docs, vocab, self.device)
        n = sum(d.length for d in docs)
        return build_row(docs, vocab, self.device, length=flex_length(n, FLEX_TILE))

    @torch.no_grad()
    def check(self, rollout: Rollout) -> float:
        """max |replayed - rollout logits| of the rollout's first selected state (same weights)."""
        first = min(rollout.blocks)
        k = select_rounds(rollout.blocks[first], self.cfg.select_fraction)[0]
        state = rollout.blocks[first][k]
        row = self.row([Doc(rollout, [state], 1.0, [Target()])])
        # in the rollout's precision (the weights' dtype, no autocast): exactness, not bf16 noise
        got = replay_logits(self.model, row, attention_mask(row.meta, self.attention))
        return (got.float() - state.logits.float()).abs().max().item()


def param_groups(model: torch.nn.Module, cfg: ORLConfig) -> list[dict]:
    """Backbone and adapter (lr x adapter_lr_scale, AdamW eps `adapter_adam_eps`: torch's 1e-8
    would sit above a young adapter's second moments and damp its steps); weight decay on
    matrices only. The backbone keeps the optimizer's eps."""
    groups: dict[tuple[bool, bool], list] = {}
    for name, p in model.named_parameters():
        adapter = ".residual_adapter." in name
        decay = p.ndim >= 2 and "embed_tokens" not in name
        groups.setdefault((adapter, decay), []).append(p)
    out = []
    for (adapter, decay), ps in sorted(groups.items()):
        group = {
            "params": ps,
            "lr": cfg.lr,
            "weight_decay": cfg.weight_decay if decay else 0.0,
            "adapter": adapter,
        }
        if adapter:
            group.update(lr=cfg.lr * cfg.adapter_lr_scale, eps=cfg.adapter_adam_eps)
        out.append(group)
    return out


def optimizer_step(
    model, optimizer, scheduler, cfg: ORLConfig, probe: ResidualProbe | None = None
) -> dict[str, float | None]:
    """Sum gradients across ranks, clip, step; the relative update sizes ||dW|| / ||W|| and,
    with `probe`, that of the adapter's output on the probe's rows."""
    dist.sum_gradients(model)
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    old = {}
    for g in optimizer.param_groups:
        old.setdefault(g["adapter"], []).extend((p, p.detach().clone()) for p in g["params"])
    if probe is not None:
        probe.output_before()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    out = {"grad_norm": grad_norm.item()}
    for adapter, pairs in old.items():
        delta = torch.sqrt(sum(((p.detach() - w) ** 2).sum() for p, w in pairs))
        norm = torch.sqrt(sum((w**2).sum() for _, w in pairs))
        out["update_adapter" if adapter else "update_backbone"] = (delta / norm).item()
    if probe is not None:
        out.update(probe.output_update())
    return out
