"""Tensor parallelism for one request under torchrun (`docs/tensor-parallel.md`).

group.py      the process group from torchrun's env vars, the active TP group, collectives with
              a named error when a peer rank is gone (a leaf: imports nothing from dlmrt)
vocab.py      vocab-parallel token statistics, sampling, z = p^T E and log-normalisers combined
              from per-rank partials (never gathering logits)
linear.py     slicing helpers, the row-parallel all-reduce hook, the vocab-parallel embedding
shard.py      sharding applied to a BUILT model (gpt-fast style): the models stay single-device
requests.py   rank 0 does the I/O: requests broadcast to every rank, followers' loop

Nothing here is imported by `dlmrt` unless a model is sharded (`LLM(..., tensor_parallel_size=N)`
or a world size > 1 under torchrun); this __init__ imports nothing, so the low layers can import
`dlmrt.distributed.group` / `vocab` without pulling in the models.
"""
