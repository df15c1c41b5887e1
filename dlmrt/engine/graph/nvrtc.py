"""CUDA C kernels of `csrc/` compiled at run time with NVRTC and launched through cuda.bindings.

Triton cannot express two things the graphs need: setting a conditional node's handle (the WHILE
condition, `csrc/block_cond.cu`) and storing into pinned, mapped host memory (the round stream,
`csrc/slot_publish.cu`). Each source is compiled once per process for the current device; a
launch enqueues on torch's current stream, so it is captured like any torch kernel. Imported
only on CUDA machines.
"""

from __future__ import annotations

import functools
from importlib.resources import files

import numpy as np
import torch
from cuda.bindings import driver, nvrtc


def ck(ret):
    """Unwrap a cuda-python (err, *values) tuple, raising on error."""
    err, rest = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    if int(getattr(err, "value", err)) != 0:
        raise RuntimeError(f"CUDA call failed: {err!r}")
    return rest[0] if len(rest) == 1 else rest


@functools.cache
def function(source: str, name: str):
    """Kernel `name` of `csrc/<source>`, compiled for the current device (once per process).
    Returns (CUfunction, keep-alive objects)."""
    torch.zeros(1, device="cuda")  # the primary context must exist before loading a module
    text = files("dlmrt._csrc").joinpath(source).read_text()
    prog = ck(nvrtc.nvrtcCreateProgram(text.encode(), source.encode(), 0, [], []))
    major, minor = torch.cuda.get_device_capability()
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(getattr(err, "value", err)) != 0:
        log = bytearray(ck(nvrtc.nvrtcGetProgramLogSize(prog)))
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC failed on {source}: " + log.decode(errors="replace"))
    ptx = bytearray(ck(nvrtc.nvrtcGetPTXSize(prog)))
    ck(nvrtc.nvrtcGetPTX(prog, ptx))
    image = np.frombuffer(bytes(ptx), dtype=np.uint8).copy()
    module = ck(driver.cuModuleLoadData(image.ctypes.data))
    return ck(driver.cuModuleGetFunction(module, name.encode())), (image, module)


def launch(fn, threads: int, args: tuple[tuple, tuple]) -> None:
    """One block of `threads` threads of `fn` on torch's current stream; `args` = (values, ctypes)."""
    stream = torch.cuda.current_stream().cuda_stream
    ck(driver.cuLaunchKernel(fn, 1, 1, 1, threads, 1, 1, 0, stream, args, 0))
