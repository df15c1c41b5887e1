"""Where the Triton kernel tests run: a CUDA device, or the CPU under TRITON_INTERPRET=1 (fp32
only there: the interpreter's bf16 casts are not the GPU's). Shared by the kernel test files.
(tests/ is on sys.path through its conftest.py.)"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
# On a CUDA machine a kernel test is a GPU test (`pytest -m gpu` selects it); on the CPU it runs
# under TRITON_INTERPRET=1 and skips otherwise.
kernel_test = (
    pytest.mark.gpu
    if CUDA
    else pytest.mark.skipif(not INTERPRET, reason="needs CUDA (or TRITON_INTERPRET=1)")
)

if INTERPRET:  # Triton 3.6's interpreter turns a runtime scalar into a loop bound with int() of a
    # one-element array, which numpy >= 2.4 refuses: kernels with runtime loop bounds
    # (kernels/fp8_gemm.py's K slices) need .item() there. The GPU compiler is not involved.
    from triton.runtime import interpreter as _interpreter

    _patch_tensor = _interpreter._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope) -> None:
        _patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    _interpreter._patch_lang_tensor = _patch_lang_tensor
