"""Tensor parallelism for one request, under torchrun or self-spawned (`docs/tensor-parallel.md`).

group.py      the process group from torchrun's env vars, the active TP group, collectives with
              a named error when a peer rank is gone (a leaf: imports nothing from dlmrt)
vocab.py      vocab-parallel token statistics, sampling, z = p^T E and log-normalisers combined
              from per-rank partials (never gathering logits)
linear.py     slicing helpers, the row-parallel all-reduce hook, the vocab-parallel embedding
shard.py      sharding applied to a BUILT model (gpt-fast style): the models stay single-device
requests.py   rank 0 does the I/O: requests broadcast to every rank, followers' loop
setup.py      what `LLM` calls: join the group, the sliced loader, one agreed execution mode
spawn.py      no torchrun: rank 0 starts ranks 1 .. N-1 itself and releases them at exit
follower.py   the entry point of such a spawned rank (imported by nothing)

Nothing here is imported by `dlmrt` unless a model is sharded (`LLM(..., tensor_parallel_size=N)`
or a world size > 1 under torchrun); this __init__ imports nothing, so the low layers can import
`dlmrt.distributed.group` / `vocab` without pulling in the models.
"""
