"""PackedRow: the tensors of one packed replay forward, and the staircase metadata.

Layout of document d (prompt P tokens, block length L, last noisy block c):

    clean   positions 0 .. c*L - 1     prompt blocks, then the clean (final) response blocks
    noisy   for each state (b, k):     positions b*L .. (b+1)*L - 1, its captured canvas

Documents follow each other; pads (to `pad_to`) are one-row documents. Visibility is the
SFT staircase (`dlmrt/train/masks.py`: noisy block b sees the prompt, the clean blocks before b
and itself; never its own clean copy, later blocks, other noisy copies or other documents; clean
never sees noisy): a document's noisy copies have distinct blocks, so `block` equality inside a
document picks exactly one copy. The captured z enters the noisy rows exactly as in the rollout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dlmrt.train.masks import MaskMeta
from dlmrt.train.orl.plan import Doc


@dataclass
class PackedRow:
    ids: torch.Tensor  # [N] long
    positions: torch.Tensor  # [N] long (noisy rows reuse their clean positions)
    meta: MaskMeta
    noisy: torch.Tensor  # [M] long: row indices of the noisy rows, state by state
    z: torch.Tensor  # [M, hidden] captured pre-adapter residual (constant: stop-gradient)
    unresolved: torch.Tensor  # [M] bool: the state's unresolved rows
    target: torch.Tensor  # [M] long: the verified response's token (0 where unweighted)
    token_weight: torch.Tensor  # [M] float32: 1 / N_R at valid positions, else 0
    h_roll: torch.Tensor  # [M] float32: the rollout's normalised entropy of the row
    segment: torch.Tensor  # [M] long: which state of the row
    aec_weight: torch.Tensor  # [S] float32 per state (0: not an AEC target)
    h_source: torch.Tensor  # [S] float32

    @property
    def num_tokens(self) -> int:
        return self.ids.shape[0]


def _doc_rows(doc: Doc, d: int, cols: dict[str, list]) -> None:
    r, full = doc.rollout, doc.rollout.full_ids
    L, c, p, end = doc.states[0].canvas.shape[0], doc.clean_len, len(r.prompt_ids), len(full)
    cols["ids"] += full[:c]
    cols["pos"] += list(range(c))
    cols["doc"] += [d] * c
    cols["noisy_flag"] += [False] * c
    cols["block"] += [p // L for p in range(c)]
    for s in doc.states:
        start, lo = len(cols["ids"]), s.block * L
        cols["ids"] += s.canvas.tolist()
        cols["pos"] += list(range(lo, lo + L))
        cols["doc"] += [d] * L
        cols["noisy_flag"] += [True] * L
        cols["block"] += [s.block] * L
        cols["noisy"] += list(range(start, start + L))
        valid = [p <= q < end for q in range(lo, lo + L)]  # response rows up to the stop id
        cols["target"] += [full[q] if v else 0 for q, v in zip(range(lo, lo + L), valid)]
        cols["weight"] += [doc.token_weight if v else 0.0 for v in valid]
        cols["states"].append(s)


def flex_length(n: int, tile: int) -> int:
    """A flex row's padded length: the next power-of-two number of tiles. The compiled
    flex_attention / create_block_mask specialise on the length; buckets keep the number of
    distinct lengths (recompiles) logarithmic, under torch.compile's cache limit."""
    tiles = -(-n // tile)
    return tile * (1 << (tiles - 1).bit_length())


def build_row(
    docs: list[Doc], vocab: int, device: torch.device, pad_to: int = 1, length: int | None = None
) -> PackedRow:
    """The packed row of `docs` (documents in order), padded to a multiple of `pad_to` (or to
    `length`, when given)."""
    cols: dict[str, list] = {
        k: []
        for k in ("ids", "pos", "doc", "noisy_flag", "block", "noisy", "target", "weight", "states")
    }
    targets = []
    for d, doc in enumerate(docs):
        _doc_rows(doc, d, cols)
        targets += doc.targets
    n = len(cols["ids"])
    pad = -n % pad_to if length is None else length - n
    if pad < 0:
        raise ValueError(f"build_row: {n} rows do not fit in length {length}")
    cols["ids"] += [0] * pad
    cols["pos"] += [0] * pad
    cols["doc"] += [-(i + 1) for i in range(pad)]
    cols["noisy_flag"] += [False] * pad
    cols["block"] += [0] * pad
    states = cols["states"]
    L = states[0].canvas.shape[0]

    def t(x, dtype):
        return torch.tensor(x, dtype=dtype, device=device)

    meta = MaskMeta(
        t(cols["doc"], torch.int32),
        t(cols["noisy_flag"], torch.bool),
        t(cols["block"], torch.int32),
    )
    return PackedRow(
        ids=t(cols["ids"], torch.long),
        positions=t(cols["pos"], torch.long),
        meta=meta,
        noisy=t(cols["noisy"], torch.long),
        z=torch.cat([s.z for s in states]).to(device),
        unresolved=torch.cat([s.unresolved for s in states]).to(device),
        target=t(cols["target"], torch.long),
        token_weight=t(cols["weight"], torch.float32),
        h_roll=torch.cat([s.entropy for s in states]).to(device) / math.log(vocab),
        segment=torch.arange(len(states), device=device).repeat_interleave(L),
        aec_weight=t([g.aec_weight for g in targets], torch.float32),
        h_source=t([g.h_source for g in targets], torch.float32),
    )
