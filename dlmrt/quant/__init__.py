"""Quantized checkpoints: FP8 (e4m3, per-output-channel scales), NVFP4 (E2M1 + per-16 e4m3 scales).

The formats themselves live in `dlmrt/formats/` (below ops and models); here: `policy.py` which parameters may be quantized; `config.py`,
`reader.py`, `nvfp4_reader.py`, `writer.py`, `nvfp4_writer.py` the checkpoint formats
(compressed-tensors, ModelOpt); `placement.py` the load-time hand-off to the models' `use_fp8`;
`quantize.py` (+ `calibration.py`, `nvfp4_scales.py`, `cli.py`) `dlmrt quantize`.
docs/quantization.md describes them.
"""
