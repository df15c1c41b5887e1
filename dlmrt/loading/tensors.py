"""A checkpoint's tensors, from the safetensors headers alone, and the strict check against the
model's: which files, which names and shapes (a family's renames, tied copies and stacked slices
applied), and a missing, unexpected or wrongly shaped tensor raised as a `CheckpointError` before
any weight is read (`checkpoint.py` then streams the weights in).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open

from dlmrt.errors import CheckpointError
from dlmrt.json_file import read_json

log = logging.getLogger("dlmrt")

LM_HEAD = "lm_head.weight"
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # a decoder layer's tensors: ...layers.N.name


def weight_files(root: Path) -> list[Path]:
    """The safetensors files of a checkpoint: from the index if present, else every *.safetensors."""
    index = read_json(root / "model.safetensors.index.json", required=False)
    if index is not None:
        if not isinstance(index.get("weight_map"), dict):
            raise CheckpointError(f"{root / 'model.safetensors.index.json'}: missing 'weight_map'")
        return [root / f for f in sorted(set(index["weight_map"].values()))]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{root}: no *.safetensors weight files")
    return files


def tensor_shapes(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Read only the headers: tensor name -> (file, shape)."""
    shapes: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: file not found (listed in model.safetensors.index.json)")
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    if name in shapes:
                        raise CheckpointError(f"{f}: tensor '{name}' also in {shapes[name][0]}")
                    shapes[name] = (f, tuple(st.get_slice(name).get_shape()))
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types for bad headers / IO
            raise CheckpointError(f"{f}: unreadable safetensors file ({e})") from e
    return shapes


def map_names(
    found: dict[str, tuple[Path, tuple[int, ...]]],
    map_name: Callable[[str], str | None] | None,
    root: Path,
) -> tuple[dict[str, tuple[Path, tuple[int, ...]]], dict[str, str]]:
    """Apply a family's `checkpoint_name(stored) -> model name | None` hook before the strict check.

    None skips a tensor (e.g. a vision tower in a text-only engine). Stored names that map to the same
    model name are tied copies: the first in sorted order is loaded, the others are ignored (their
    shapes must agree). Returns (model name -> (file, shape), model name -> stored name).
    """
    if map_name is None:
        return found, {name: name for name in found}
    mapped: dict[str, tuple[Path, tuple[int, ...]]] = {}
    source: dict[str, str] = {}
    skipped, duplicates = [], []
    for stored in sorted(found):
        name = map_name(stored)
        if name is None:
            skipped.append(stored)
        elif name in mapped:
            if mapped[name][1] != found[stored][1]:
                raise CheckpointError(
                    f"{found[stored][0]}: tied copies '{source[name]}' and '{stored}' differ in shape"
                )
            duplicates.append(stored)
        else:
            mapped[name], source[name] = found[stored], stored
    for names, what in (
        (skipped, "tensor(s) the model does not use"),
        (duplicates, "tied duplicate tensor(s)"),
    ):
        if names:
            log.info("%s: ignoring %d %s, e.g. %s", root, len(names), what, names[0])
    return mapped, source


def check_layer_count(
    layers: int | None, found: dict[str, tuple[Path, tuple[int, ...]]], cfg_path: Path
) -> None:
    """`num_hidden_layers` no larger than the layers the tensors hold, checked before the model is
    built: building costs time per layer (100000 layers: minutes), and every extra layer would
    be reported missing only after it. No `layers.N.` tensors at all: nothing to compare."""
    held = {int(m.group(1)) for name in found if (m := LAYER.search(name))}
    if layers is None or not held or layers <= max(held) + 1:
        return
    raise CheckpointError(
        f"{cfg_path}: num_hidden_layers is {layers}, but the checkpoint's tensors hold "
        f"{max(held) + 1} layer(s) (layers.0 .. layers.{max(held)})"
    )


def expand_slices(
    expected: dict[str, tuple[int, ...]], slices: dict[str, tuple[str, int]]
) -> dict[str, tuple[int, ...]]:
    """Replace each stacked parameter [N, ...] by the N stored tensors that fill its slices.

    A family's `checkpoint_slices()` maps stored name -> (stacked parameter, index), e.g. LLaDA2's
    per-expert `mlp.experts.E.gate_proj.weight` -> (`mlp.experts.gate_proj`, E). The strict check
    then names the stored tensors (a missing expert is reported by its checkpoint name).
    """
    if not slices:
        return expected
    out = {n: s for n, s in expected.items() if n not in {p for p, _ in slices.values()}}
    for name, (param, _) in slices.items():
        out[name] = expected[param][1:]
    return out


def check_tensors(
    expected: dict[str, tuple[int, ...]],
    found: dict[str, tuple[Path, tuple[int, ...]]],
    tie: bool | None,
    root: Path,
) -> bool:
    """Compare checkpoint tensors with the model's; return whether lm_head is tied to the embeddings."""
    # As transformers: a config that ties ignores a stored lm_head; unstated ties iff it is absent.
    tied = tie is True or (tie is None and LM_HEAD not in found)
    if tied and LM_HEAD in found:
        log.info("%s: config ties the embeddings; ignoring the stored %s", root, LM_HEAD)
        del found[LM_HEAD]
    missing = [n for n in expected if n not in found and not (tied and n == LM_HEAD)]
    if missing:
        files = ", ".join(sorted({f.name for f, _ in found.values()})) or "no tensors"
        raise CheckpointError(
            f"{root} ({files}): missing tensor(s) {missing[:8]}"
            + (" ..." if len(missing) > 8 else "")
        )
    unexpected = [n for n in found if n not in expected]
    if unexpected:
        f = found[unexpected[0]][0]
        raise CheckpointError(f"{f}: unexpected tensor(s) {unexpected[:8]}")
    for name, (f, shape) in found.items():
        if tuple(expected[name]) != shape:
            raise CheckpointError(
                f"{f}: tensor '{name}' has shape {list(shape)}, expected {list(expected[name])}"
            )
    return tied
