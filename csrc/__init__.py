"""CUDA C sources compiled at run time with NVRTC (installed as dlmrt._csrc)."""
