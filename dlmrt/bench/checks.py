"""Checks of `dlmrt bench`'s arguments made before the model loads, so that a bad flag fails in a
second rather than after a long run: output paths, --timeout, --prompt-template, --plot-x."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PLOT_X = ("tps", "tpf")


def check_bench_args(args: Any) -> None:
    """ValueError naming the flag for the first bad argument."""
    timeout = args.timeout
    if not (isinstance(timeout, int | float) and timeout > 0 and timeout != float("inf")):
        raise ValueError(f"--timeout: must be a number of seconds > 0, got {timeout!r}")
    check_template(args.prompt_template)
    plot_x = getattr(args, "plot_x", "tps")
    if plot_x not in PLOT_X:
        raise ValueError(f"--plot-x: must be one of {', '.join(PLOT_X)}, got {plot_x!r}")
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path:
            check_output_path(path, flag)
    if args.out and args.plot and Path(args.out).resolve() == Path(args.plot).resolve():
        raise ValueError(f"--out and --plot: both name {args.out} (one would overwrite the other)")


def check_template(template: str | None) -> None:
    if template is not None and "{prompt}" not in template:
        raise ValueError(
            f"--prompt-template: {template!r} has no '{{prompt}}' (where the problem text goes)"
        )


def check_output_path(path: str | Path, flag: str) -> None:
    """`path` can be written: not a directory, and its parent exists as a writable directory or can
    be created (its nearest existing ancestor is a writable directory)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a directory (expected a file path)")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag}: {path} exists and is not writable")
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{flag}: {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: {path}: cannot write in {ancestor} (permission denied)")
