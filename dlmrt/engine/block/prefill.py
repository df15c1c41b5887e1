"""PrefillGraphs: the prompt's clean forward as a captured CUDA graph per length bucket (graph modes).

Eager prefill is most of a small model's request (issue 23: ~7.6 ms of Python and ~970 launches
per prefill of the demo model). In `round_graph` / `block_graph` the prefill of n rows (a multiple
of the block length B) runs instead as the replay of a graph captured for a bucket of L >= n rows,
over static buffers: ids [L] (the prompt, then padding) and positions 0 .. L-1. The padded rows
change no real row and no KV row that matters:

- they sit at positions >= n, i.e. in later blocks: under the block-causal rule (a row at p sees
  arena rows [0, (p // B + 1) * B)) no real row sees them, and every other op is row-wise;
- they write K/V into arena rows n .. L-1, the rows of decode blocks; a block's rows are written
  by each of its passes in each layer before that layer attends to them, so nothing reads the
  padding's K/V (L never exceeds the arena).

Buckets are B * 2^k and B * 3 * 2^(k-1) (at most a third of a bucket is padding), up to
`MAX_GRAPH_ROWS`; a longer prefill is compute-bound (launch overhead is noise there) and runs
eagerly, which also bounds the graphs' memory. Graphs are captured at a bucket's first use and
hold pointers into one arena: a new arena (growth) takes a new `PrefillGraphs`.
"""

from __future__ import annotations

import torch

from dlmrt.attention import AttnContext
from dlmrt.engine.graph.capture import capture
from dlmrt.engine.kv_cache import KVCache

MAX_GRAPH_ROWS = 2048  # longer prefills run eagerly (compute-bound; bounds the pool)
PAD_ID = 0  # any valid id: the padded rows are invisible to the real ones


def bucket_rows(rows: int, block_length: int) -> int | None:
    """The padded row count of a prefill of `rows` rows (a positive multiple of `block_length`):
    the smallest B * 2^k or B * 3 * 2^(k-1) >= rows; None above MAX_GRAPH_ROWS (run eagerly)."""
    if rows <= 0 or rows % block_length:
        raise ValueError(f"prefill of {rows} rows: expected a positive multiple of {block_length}")
    blocks = rows // block_length
    pow2 = 1 << (blocks - 1).bit_length()  # the smallest 2^k >= blocks
    size = pow2 * 3 // 4 if pow2 >= 4 and pow2 * 3 // 4 >= blocks else pow2
    bucket = size * block_length
    return bucket if bucket <= MAX_GRAPH_ROWS else None


class PrefillGraphs:
    """Captured prefill forwards over one arena, keyed by (bucket rows, block length).

    `pool` None: no graphs, the padded forward runs eagerly (the CPU tests of the padding: on the
    CPU the rows attend to the first `bucket` arena rows, host-bounded, under the same rule)."""

    def __init__(
        self, model: torch.nn.Module, kv: KVCache, device: torch.device, pool=None
    ) -> None:
        self.model, self.kv, self.pool, self.device = model, kv, pool, device
        self.stream = torch.cuda.Stream(device) if pool is not None else None
        rows = min(MAX_GRAPH_ROWS, kv.max_len)
        self.ids = torch.full((rows,), PAD_ID, dtype=torch.long, device=device)
        self.positions = torch.arange(rows, device=device)
        # Pinned staging: one host write and one async copy per prefill. Reusing it is safe: the
        # request's first read-back (after its first block) waits for this copy to have run.
        self.host = torch.full((rows,), PAD_ID, dtype=torch.long)
        if device.type == "cuda":
            self.host = self.host.pin_memory()
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def bucket(self, rows: int, block_length: int) -> int | None:
        """The bucket a prefill of `rows` rows replays, or None if it runs eagerly."""
        bucket = bucket_rows(rows, block_length)
        return bucket if bucket is not None and bucket <= self.ids.numel() else None

    def run(self, tokens: list[int], block_length: int) -> bool:
        """Write the prompt's K/V by a graph replay; False (nothing done) if it runs eagerly."""
        rows = len(tokens)
        bucket = self.bucket(rows, block_length)
        if bucket is None:
            return False
        host = self.host.numpy()
        host[:rows] = tokens
        host[rows:bucket] = PAD_ID
        self.ids[:bucket].copy_(self.host[:bucket], non_blocking=True)
        key = (bucket, block_length)
        if self.pool is None:
            self._body(bucket, block_length)()
        else:
            if key not in self.graphs:  # its warm-ups write the same K/V as the replay
                body = self._body(bucket, block_length)
                self.graphs[key] = capture(body, self.stream, self.pool)
            self.graphs[key].replay()
        return True

    def _body(self, bucket: int, block_length: int):
        kv_len = bucket if self.device.type == "cpu" else None  # CUDA: lengths from positions
        positions = self.positions[:bucket]
        ids, ctx = self.ids[:bucket], AttnContext(positions, block_length, self.kv, kv_len)

        def body() -> None:
            self.model(ids, ctx, compute_logits=False)

        return body
