"""PrefillGraphs: the prompt's clean forward as captured CUDA graphs per length bucket (graph modes).

Eager prefill is most of a small model's request (issue 23: ~7.6 ms of Python and ~970 launches
per prefill of the demo model). In `round_graph` / `block_graph` the prefill of n rows (a multiple
of the block length B) runs instead as graph replays over static buffers: all n ids staged with
one host write and one async copy, then chunks of at most `MAX_GRAPH_ROWS` rows, each the replay
of the graph of its bucket L (the chunk padded) at a device-side start s: rows s .. s+L-1 gather
their ids and positions on the device, so one graph serves a bucket at any start.
A prefill may start at a row f > 0 (a reused prefix: rows below f hold their K/V already; the
block style's f is a block boundary, the causal encoder's any row); its chunks then start at f,
f + C, ... with the same graphs.

Chunks change nothing: a row at position p sees arena rows [0, (p // B + 1) * B) (block-causal),
all written by earlier chunks or by its own, with the same values; the attention of a row does not
depend on which rows share its tile (keys past its end are masked to exactly zero weight). Chunks
also bound the prefill's activations (the graph pool) by those of MAX_GRAPH_ROWS rows.

The padded rows of a chunk change no real row and no KV row that matters:
- they sit at positions >= n, i.e. in later blocks: under the block-causal rule no real row sees
  them, and every other op is row-wise;
- they write K/V into arena rows n .. s+L-1, the rows of decode blocks; a block's rows are written
  by each of its passes in each layer before that layer attends to them, so nothing reads the
  padding's K/V (s + L never exceeds the arena; if it would, the prefill runs eagerly).

Buckets are B * 2^k and B * 3 * 2^(k-1) (at most a third of a bucket is padding). Graphs are
captured at a bucket's first use and hold pointers into one arena: they live in the workspace's
`extras` and go with it when the arena grows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlmrt.engine.graph.capture import capture

MAX_GRAPH_ROWS = 2048  # rows per chunk at most: bounds the graph pool (activations)
PAD_ID = 0  # any valid id: the padded rows are invisible to the real ones


def bucket_rows(rows: int, block_length: int) -> int | None:
    """The padded row count of a chunk of `rows` rows (a positive multiple of `block_length`):
    the smallest B * 2^k or B * 3 * 2^(k-1) >= rows; None above MAX_GRAPH_ROWS."""
    if rows <= 0 or rows % block_length:
        raise ValueError(f"prefill of {rows} rows: expected a positive multiple of {block_length}")
    blocks = rows // block_length
    pow2 = 1 << (blocks - 1).bit_length()  # the smallest 2^k >= blocks
    size = pow2 * 3 // 4 if pow2 >= 4 and pow2 * 3 // 4 >= blocks else pow2
    bucket = size * block_length
    return bucket if bucket <= MAX_GRAPH_ROWS else None


def chunk_rows(block_length: int) -> int | None:
    """Rows per full chunk: the largest bucket <= MAX_GRAPH_ROWS (None: a block is larger)."""
    blocks = MAX_GRAPH_ROWS // block_length
    if blocks == 0:
        return None
    pow2 = 1 << (blocks.bit_length() - 1)  # the largest 2^k <= blocks
    return (pow2 * 3 // 2 if pow2 >= 2 and pow2 * 3 // 2 <= blocks else pow2) * block_length


def chunks(rows: int, block_length: int) -> list[tuple[int, int]] | None:
    """(start, bucket) of each chunk of a prefill of `rows` rows; None if one block is too big."""
    size = chunk_rows(block_length)
    if size is None:
        return None
    return [(s, bucket_rows(min(size, rows - s), block_length)) for s in range(0, rows, size)]


Forward = Callable[[torch.Tensor, torch.Tensor, int, "int | None"], None]


class PrefillGraphs:
    """Captured prefill chunks over one arena, keyed by (bucket rows, granule).

    `forward(ids, positions, granule, kv_len)` is the style's clean pass over those rows (the block
    style: granule = the block length; DiffusionGemma's causal encoder pass: a fixed granule, the
    prompt padded up to it first). `pool` None: no graphs, the padded chunks run eagerly (the CPU
    tests: there rows attend to the first s + L arena rows, host-bounded, under the same rule)."""

    def __init__(self, forward: Forward, max_len: int, device: torch.device, pool=None) -> None:
        self.forward, self.max_len, self.pool, self.device = forward, max_len, pool, device
        self.stream = torch.cuda.Stream(device) if pool is not None else None
        self.ids = torch.full((max_len,), PAD_ID, dtype=torch.long, device=device)
        self.offsets = torch.arange(min(MAX_GRAPH_ROWS, max_len), device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)
        # Pinned staging: one host write and one async copy per prefill; the host waits for the
        # previous copy out of it (`copied`, long passed in practice) before rewriting it.
        self.host = torch.full((max_len,), PAD_ID, dtype=torch.long)
        self.copied = None
        if device.type == "cuda":
            self.host, self.copied = self.host.pin_memory(), torch.cuda.Event()
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def run(self, tokens: list[int], granule: int, first: int = 0) -> bool:
        """Write the prompt's K/V by graph replays; False (nothing done) if it runs eagerly.
        first: rows before it hold their K/V already (a reused prefix); the chunks cover rows
        first .. len(tokens) - 1, padded to whole granules. The block style's first is a block
        boundary (block-causal K/V); the causal encoder's may be any row."""
        rows = len(tokens)
        plan = chunks(-(-(rows - first) // granule) * granule, granule)
        if plan is None:
            return False
        plan = [(first + s, bucket) for s, bucket in plan]
        end = plan[-1][0] + plan[-1][1]
        if end > self.max_len:
            return False
        if self.copied is not None:
            self.copied.synchronize()
        host = self.host.numpy()
        host[first:rows] = tokens[first:]
        host[rows:end] = PAD_ID
        self.ids[first:end].copy_(self.host[first:end], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        for start, bucket in plan:
            self.start.fill_(start)
            if self.pool is None:  # eager: the same padded chunks (the CPU: host-bounded keys)
                self._chunk(bucket, granule, start + bucket if self.device.type == "cpu" else None)
                continue
            key = (bucket, granule)
            if key not in self.graphs:  # its warm-ups write the same K/V as the replay
                body = lambda b=bucket: self._chunk(b, granule)  # noqa: E731
                self.graphs[key] = capture(body, self.stream, self.pool)
            self.graphs[key].replay()
        return True

    def _chunk(self, bucket: int, granule: int, kv_len: int | None = None) -> None:
        """One chunk at the device-side start. kv_len: the CPU's host bound; None on CUDA, where
        eager and the graphs must run the same attention kernel (device-side visibility)."""
        positions = self.start + self.offsets[:bucket]
        self.forward(self.ids[positions], positions, granule, kv_len)
