"""Writing quantized checkpoints (`dlmrt quantize`): FP8 (e4m3, per-output-channel or per-tensor
scales) and NVFP4 (E2M1 + per-16 e4m3 scales), in compressed-tensors or ModelOpt form.

`quantize.py` (+ `calibration.py`, `nvfp4_scales.py`, `quantize_config.py`, `cli.py`) the tool;
`writer.py`, `nvfp4_writer.py`, `per_tensor.py` the stored forms. Reading them back, and which
parameters may be quantized, is `dlmrt/loading/`; the formats themselves `dlmrt/formats/`.
docs/quantization.md describes them.
"""
