"""ORL: on-policy residual learning (`dlmrt train orl`, docs/orl-training.md).

Per step: rollouts with the current weights through dlmrt's own engine (states captured by the
engine's recorder) -> verifier -> selection -> packed staircase replay -> CE + AEC (+ entropy-gated
CE and capped reverse KL) -> one optimizer step. `train_orl` (loop.py) is the entry point.
"""
