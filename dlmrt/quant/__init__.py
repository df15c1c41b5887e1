"""FP8 weights: the format (`fp8.py`), which parameters may be FP8 (`policy.py`), the checkpoint
formats (`config.py`, `reader.py`, `writer.py`) and the load-time placement (`placement.py`).
docs/quantization.md describes them."""

from dlmrt.quant.config import QuantConfig, read_quant_config
from dlmrt.quant.fp8 import FP8_DTYPE, FP8_MAX, Fp8Weight, quantize_per_channel, quantize_per_tensor
from dlmrt.quant.placement import collect_fp8, place_fp8
from dlmrt.quant.policy import classify, is_candidate
from dlmrt.quant.reader import Fp8Reader

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "Fp8Reader",
    "Fp8Weight",
    "QuantConfig",
    "classify",
    "collect_fp8",
    "is_candidate",
    "place_fp8",
    "quantize_per_channel",
    "quantize_per_tensor",
    "read_quant_config",
]
