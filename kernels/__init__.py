"""Triton kernels, installed as dlmrt._kernels (imports nothing from dlmrt)."""
