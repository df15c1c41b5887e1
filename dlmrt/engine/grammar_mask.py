"""The grammar's row masks on the device, shared by the block and canvas engines' structured paths.

A chain of allowed-sets (`Constraint.chain`) arrives packed as llguidance computes them
(`dlmrt/structured/closing.py: Mask`, token t at bit t % 32 of word t // 32): one [vocab / 32]
int32 row per masked row, about 19 KB at a 152k vocabulary against 152 KB unpacked. They are
uploaded packed and unpacked on the device, where only the chain's rows are written: a round never
builds or uploads a [rows, vocab] host tensor (at 256 rows x 152k tokens that was 39 MB a round).
"""

from __future__ import annotations

import numpy as np
import torch

from dlmrt.structured.closing import Mask

# The model's candidates per row that a speculated chain picks its token from (`best_allowed`).
TOP_K = 32


def best_allowed(top: list[int], ok: Mask) -> int | None:
    """The token a masked row of the chain stands for: the model's best allowed token among its
    `top` candidates (best first), else the grammar's only allowed token (a forced row, e.g.
    the `:` after a JSON key, whatever the model ranked); None (the chain ends) when neither."""
    hits = ok.allows(np.asarray(top, dtype=np.int64))
    if hits.any():
        return top[int(hits.argmax())]
    return ok.first(1)[0] if ok.count() == 1 else None


def unpack(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, vocab] bool from packed [n, ceil(vocab / 32)] int32 allowed-sets (on their device)."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    return ((words.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab].bool()


def mask_rows(logits: torch.Tensor, rows: list[int], masks: list[Mask]) -> torch.Tensor:
    """A copy of [R, V] `logits` with each of `rows` masked to its allowed-set (-inf elsewhere);
    the other rows keep their logits."""
    if not rows:
        return logits
    packed = np.stack([m.words for m in masks]).view(np.int32)
    words = torch.from_numpy(packed).to(logits.device)
    idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
    out = logits.clone()
    out[idx] = out[idx].masked_fill(~unpack(words, logits.shape[-1]), float("-inf"))
    return out
