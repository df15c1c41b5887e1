"""Tensor parallelism for one request, under torchrun or self-spawned (`docs/tensor-parallel.md`).

shard.py      sharding applied to a BUILT model (gpt-fast style): the models stay single-device
requests.py   rank 0 does the I/O: requests broadcast to every rank, followers' loop
setup.py      what `LLM` calls: join the group, the sliced loader, one agreed execution mode
spawn.py      no torchrun: rank 0 starts ranks 1 .. N-1 itself and releases them at exit

The primitives it applies (the group, vocab-parallel statistics, parallel linears) are
`dlmrt/parallel/`, below the models; a spawned rank's entry point is `dlmrt/tp_follower.py`.
"""
