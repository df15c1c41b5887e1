"""The block-diffusion SFT loss: one forward over a packed [clean | noisy] row, CE on masked rows.

Weighting (`loss_weighting`):
  mean  sum of CE over the masked noisy tokens / their number (the default). TraDo's
        `sft_sdar.py` trains SDAR with unweighted CE on the masked tokens (no 1/t), normalised by
        a constant; a token mean is the same up to the normaliser, and is what the tiny-model
        feasibility run (the demo model, `dlmrt/assets/demo/README.md`) reached 100% with. Every decoding state
        (block mask ratio) weighs the same, which is what a confidence-threshold decoder needs.
  elbo  MDLM / BD3-LM / SDAR-pretraining weighting: each masked token's CE times 1/t (t = the
        mask ratio of its block), summed and divided by the number of response tokens in the
        noisy blocks: an unbiased estimate of the per-token NELBO, with more variance.

With gradient accumulation every pack's sum is divided by the whole step's count, so a step of
several packs has the same loss (and gradient) as one pack holding all their examples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlmrt.attention import AttnContext
from dlmrt.train.data import Batch

WEIGHTINGS = ("mean", "elbo")


def normalizer(batches: list[Batch], weighting: str) -> int:
    """The step's loss denominator (host-side counts: no device sync)."""
    if weighting == "mean":
        return max(sum(b.num_masked for b in batches), 1)
    if weighting == "elbo":
        return max(sum(b.num_response for b in batches), 1)
    raise ValueError(f"loss_weighting: expected one of {', '.join(WEIGHTINGS)}, got {weighting!r}")


def sft_loss(
    model: torch.nn.Module,
    batch: Batch,
    attn_mask,
    block_size: int,
    weighting: str = "mean",
    denominator: int | None = None,
) -> torch.Tensor:
    """This pack's share of the step loss (`denominator`: `normalizer` of the step's packs)."""
    if denominator is None:
        denominator = normalizer([batch], weighting)
    ctx = AttnContext(batch.positions, block_size, mask=attn_mask)
    logits = model(batch.input_ids, ctx)
    rows = batch.loss_rows
    ce = F.cross_entropy(logits[rows].float(), batch.labels[rows], reduction="none")
    if weighting == "elbo":
        ce = ce / batch.ratio[rows]
    return ce.sum() / denominator
