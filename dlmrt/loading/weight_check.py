"""NaN/Inf check of checkpoint tensors while they stream in (`load_checkpoint(check_finite=True)`).

A non-finite weight otherwise loads silently and decodes to empty answers. The check runs on the
device each tensor lands on, in the dtype it is stored in (so a float32 value that overflows
float16 is caught too), and syncs with the host once per checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dlmrt.errors import CheckpointError


class FiniteCheck:
    """Collect a NaN/Inf flag per tensor on its device; one host sync at the end (`raise_if_bad`).

    min/max propagate NaN and show +-Inf, and reduce without a tensor-sized temporary."""

    def __init__(self) -> None:
        self.flags: list[torch.Tensor] = []
        self.tensors: list[tuple[Path, str, torch.Tensor]] = []

    def add(self, f: Path, stored: str, tensor: torch.Tensor) -> None:
        if not tensor.is_floating_point() or tensor.numel() == 0:
            return
        lo, hi = torch.aminmax(tensor)
        self.flags.append(~(torch.isfinite(lo) & torch.isfinite(hi)))
        self.tensors.append((f, stored, tensor))

    def raise_if_bad(self, dtype: torch.dtype) -> None:
        """Raise a CheckpointError naming the first non-finite tensor; either way the check lets
        go of every tensor it holds (a view keeps a weight alive that fusing or a quantized
        install would free while loading)."""
        flags, tensors = self.flags, self.tensors
        self.flags, self.tensors = [], []
        if not flags:
            return
        # flags of tensors checked on the host (a deferred NVFP4 weight's scales) join the device's
        device = next((f.device for f in flags if f.device.type != "cpu"), flags[0].device)
        bad = torch.stack([f.to(device) for f in flags]).nonzero().flatten().tolist()  # one sync
        if not bad:
            return
        f, stored, tensor = tensors[bad[0]]
        nan, inf = int(tensor.isnan().sum()), int(tensor.isinf().sum())
        more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
        raise CheckpointError(
            f"{f}: tensor '{stored}' has non-finite values in {str(dtype).removeprefix('torch.')} "
            f"({nan} NaN, {inf} Inf of {tensor.numel()}){more}; "
            "pass --skip-weight-check (skip_weight_check=True) to load it anyway"
        )
