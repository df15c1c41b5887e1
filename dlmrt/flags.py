"""Command-line flags derived from frozen config dataclasses (a leaf module: every CLI imports it).

Each field gives one `--kebab-case` flag with its type, default and help text (`field.metadata`),
so the command line and the Python API cannot drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def add_dataclass_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    title: str,
    choices: dict[str, tuple] | None = None,
    keep_absent: bool = False,
) -> None:
    """One --kebab-case flag per dataclass field; `None` defaults mean "decided by the checkpoint".

    choices: allowed values per field name (else the field's `metadata["choices"]`).
    keep_absent: flags not given stay out of the namespace (argparse.SUPPRESS), so a saved
    config's values survive (training resume).
    """
    choices = choices or {}
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        flags = (flag, *f.metadata.get("aliases", ()))
        help_text = f.metadata.get("help", "")
        value = argparse.SUPPRESS if keep_absent else f.default
        ann = str(f.type)
        if ann == "bool":  # on by default: --flag / --no-flag
            on = f.default is True
            action = argparse.BooleanOptionalAction if on else "store_true"
            shown = help_text + (" (default: on)" if on else " (default: off)")
            group.add_argument(*flags, action=action, default=value, help=shown)
            continue
        kind = int if ann.startswith("int") else float if ann.startswith("float") else str
        default = "" if f.default is None else f" (default: {f.default})"
        group.add_argument(
            *flags,
            type=kind,
            default=value,
            help=help_text + default,
            choices=choices.get(f.name, f.metadata.get("choices")),
        )


def values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
