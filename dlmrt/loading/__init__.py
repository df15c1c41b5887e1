"""Loading a checkpoint: `checkpoint.py` (an HF-format directory -> the family's model, weights
streamed once, checked), `quant_config.py` (the checkpoint's quantization_config /
hf_quant_config.json), `policy.py` (which parameters may be quantized: one table for the loader
and the writers), `reader.py` / `nvfp4_reader.py` (FP8 and NVFP4 weights as stored:
compressed-tensors, ModelOpt), `placement.py` (what runs quantized on this device: the hand-off
to the model's `use_quantized`). The weight formats are `dlmrt/formats/`; writing quantized checkpoints
(`dlmrt quantize`) is `dlmrt/quant/`. docs/checkpoint-format.md, docs/quantization.md.
"""
