"""HF-format checkpoint files of a run, and `export`: a clean model directory for shipping.

A run directory (and each of its checkpoints) is a complete HF model directory that `LLM` loads
as-is: `config.json` (SDARForCausalLM, `block_size`, `mask_token_id`), `generation_config.json`
(stop ids <|im_end|> and <|endoftext|>), `model.safetensors` (fp32 master weights, tied
lm_head left out), `tokenizer.json` and `tokenizer_config.json` (ChatML template).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dlmrt.config import DTYPE_NAMES, torch_dtypes
from dlmrt.errors import CheckpointError
from dlmrt.styles.decoder_defaults import KEY, DecoderDefaults
from dlmrt.train.disk_full import writing

HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
WEIGHTS = "model.safetensors"


def generation_config(specials: dict[str, int]) -> dict:
    return {
        "bos_token_id": specials["<|endoftext|>"],
        "eos_token_id": [specials["<|im_end|>"], specials["<|endoftext|>"]],
        "pad_token_id": specials["<|endoftext|>"],
    }


def new_file_mode() -> int:
    """The mode `open()` gives a new file: 0o666 less the process umask (0o644 under 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """`save_file`, readable like the run's other files: safetensors writes a private (0o600)
    temporary file and renames it, so the mode is set to a new file's afterwards. A full disk
    raises `DiskFull` naming `path` (safetensors' own error names no file)."""
    with writing(path):
        save_file(tensors, str(path), metadata={"format": "pt"})
    os.chmod(path, new_file_mode())


def write_json(path: Path, value: dict) -> None:
    """Write a JSON file atomically (temporary file, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path), _removed_on_error(tmp):
        tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


def copy_atomic(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp")
    with writing(dest), _removed_on_error(tmp):
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


@contextmanager
def _removed_on_error(tmp: Path) -> Iterator[None]:
    """A failed write (a full disk) leaves no partial temporary file behind."""
    try:
        yield
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete `checkpoints/step-N` of a run (complete: it was renamed into place)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    steps = [
        (int(p.name[5:]), p)
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit()
    ]
    return max(steps)[1] if steps else None


def export(
    src: str | Path, dest: str | Path, dtype: str = "bfloat16", decoder: dict | None = None
) -> Path:
    """Copy a model directory (a run, or one of its checkpoints) to `dest`, weights in `dtype`.

    Only the HF files are copied (no optimizer state, logs or checkpoints); `dest` must not exist.
    decoder: the model's own default decoder, e.g. {"rule": "entropy_budget", "entropy_budget":
    0.4}, written to generation_config.json as "dlmrt_decoder" (`dlmrt/styles/decoder_defaults.py`).
    """
    src, dest = Path(src), Path(dest)
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    if decoder:
        try:  # the loader's own checks, before anything is written
            DecoderDefaults.read("threshold", {KEY: decoder}, Path("decoder"))
        except CheckpointError as e:
            raise ValueError(str(e)) from None
    if not (src / WEIGHTS).is_file():
        raise ValueError(f"{src}: no {WEIGHTS} (not a model directory, or no checkpoint yet)")
    if dest.exists():
        raise ValueError(f"{dest}: already exists")
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in HF_FILES:
        shutil.copyfile(src / name, tmp / name)
    tensors = {
        k: v.to(torch_dtypes()[dtype]).contiguous()
        for k, v in load_file(str(src / WEIGHTS)).items()
    }
    save_tensors(tensors, tmp / WEIGHTS)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["torch_dtype"] = dtype
    write_json(tmp / "config.json", cfg)
    if decoder:
        gen = json.loads((tmp / "generation_config.json").read_text())
        write_json(tmp / "generation_config.json", {**gen, KEY: decoder})
    os.replace(tmp, dest)
    return dest
