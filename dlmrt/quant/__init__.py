"""Quantized weights: FP8 (e4m3, per-output-channel scales) and the activations that meet them.

`fp8.py` the format; `policy.py` which parameters may be FP8; `config.py`, `reader.py`, `writer.py`
the checkpoint formats (compressed-tensors, ModelOpt); `placement.py` the load-time hand-off to the
models' `use_fp8`. docs/quantization.md describes them.
"""
