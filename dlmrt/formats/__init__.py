"""Weight formats: FP8 (`fp8.py`: e4m3 codes with per-output-channel scales, row-quantized
activations) and NVFP4 (`nvfp4.py`: E2M1 codes with per-16 e4m3 block scales and a global scale).

Plain tensor containers and their (de)quantization, torch only: the bottom layer that `ops`,
`models` and the checkpoint code (`dlmrt/quant/`) all read, importing nothing else of dlmrt.
"""
