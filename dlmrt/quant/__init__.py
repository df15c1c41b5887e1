"""Quantized weights: FP8 (e4m3, per-output-channel scales) and the activations that meet them."""
