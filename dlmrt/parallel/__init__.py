"""Tensor-parallel primitives, below the models and engines that use them (`docs/tensor-parallel.md`).

group.py      the process group from torchrun's env vars, the active TP group, collectives with
              a named error when a peer rank is gone (imports nothing from dlmrt)
vocab.py      vocab-parallel token statistics, sampling, z = p^T E and log-normalisers combined
              from per-rank partials (never gathering logits)
linear.py     slicing helpers, the row-parallel all-reduce hook, the vocab-parallel embedding

What applies them to a model and runs the ranks is `dlmrt/distributed/`.
"""
