"""Recipe files: a whole ORL run in one TOML file (`recipes/arithmetic-orl.toml`).

Top-level keys are ORLConfig fields plus `out` (the run directory); an unknown key is an error
naming it. Command-line flags override the recipe; on `--resume` the run's saved orl_config.json
is the base and only the recipe's and flags' values given replace it (and must be resumable).
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from dlmrt.train.orl.config import ORLConfig

EXTRA = ("out",)


def load_recipe(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--recipe: {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--recipe: {path} is not valid TOML: {e}") from None
    known = {f.name for f in dataclasses.fields(ORLConfig)} | set(EXTRA)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"--recipe: {path}: unknown key(s) {unknown} (ORLConfig fields or 'out')")
    return raw


def to_toml(cfg: ORLConfig, out: str | None = None) -> str:
    """A recipe recording every knob of `cfg` (None values are left out: they mean the default)."""
    lines = [] if out is None else [f"out = {_value(out)}"]
    for f in dataclasses.fields(ORLConfig):
        value = getattr(cfg, f.name)
        if value is not None:
            lines.append(f"{f.name} = {_value(value)}  # {f.metadata.get('help', '')}")
    return "\n".join(lines) + "\n"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)
