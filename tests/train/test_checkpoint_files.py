"""A run's checkpoint files: a full disk is said as such and names the file (torch.save reports it
as an internal error, safetensors without a path); a resumed trainer state is unpickled with
torch's weights-only loader, so a planted file runs no code."""

from __future__ import annotations

import errno
import io
import os

import pytest
import torch
from safetensors import SafetensorError
from test_train_sft import tiny

from dlmrt.errors import CheckpointError
from dlmrt.train import disk_full, export, run_dir
from dlmrt.train.trainer import train_sft

# What safetensors raises when the disk fills (its Rust io::Error, printed; no file name).
SAFETENSORS_FULL = (
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
    'left on device" })'
)


class FullDisk(io.RawIOBase):
    """A file on a disk with `room` bytes left: a write past it raises ENOSPC, as the OS does."""

    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return len(data)


def _full_open(room: int):
    def open_(path, mode="r", *args, **kwargs):
        assert mode == "wb"
        return io.BufferedWriter(FullDisk(room), buffer_size=64)

    return open_


@pytest.mark.parametrize("room", [0, 600, 5000])
def test_torch_save_on_a_full_disk_says_disk_full_and_names_the_file(tmp_path, monkeypatch, room):
    monkeypatch.setattr(disk_full, "open", _full_open(room), raising=False)
    path = tmp_path / "trainer_state.pt"
    with pytest.raises(disk_full.DiskFull) as info:
        disk_full.save_torch({"w": torch.zeros(10_000)}, path)
    assert str(info.value) == f"disk full: no space left to write {path}"
    assert info.value.errno == errno.ENOSPC
    assert "unexpected pos" not in str(info.value)


def test_other_torch_errors_are_not_called_a_full_disk(tmp_path):
    with pytest.raises(Exception) as info:
        disk_full.save_torch({"f": lambda: 0}, tmp_path / "x.pt")  # a lambda cannot be pickled
    assert not isinstance(info.value, disk_full.DiskFull)


def test_safetensors_on_a_full_disk_says_disk_full_and_names_the_file(tmp_path, monkeypatch):
    def save_file(*args, **kwargs):
        raise SafetensorError(SAFETENSORS_FULL)

    monkeypatch.setattr(export, "save_file", save_file)
    path = tmp_path / "model.safetensors"
    with pytest.raises(OSError, match=f"^disk full: no space left to write {path}$"):
        export.save_tensors({"w": torch.zeros(4)}, path)


def test_a_checkpoint_on_a_full_disk_is_named_and_leaves_nothing_partial(tmp_path, monkeypatch):
    """torch's own error on a full disk (through its real writer) becomes 'disk full' naming
    trainer_state.pt; the partial step directory is removed."""
    out = tmp_path / "run"
    train_sft(tiny(steps=1), out, progress=False)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    monkeypatch.setattr(run_dir, "save_weights", lambda m, p: p.write_bytes(b""))
    monkeypatch.setattr(disk_full, "open", _full_open(600), raising=False)
    ckpts = run_dir.Checkpointer(out, 2)
    with pytest.raises(OSError, match="disk full: no space left to write .*trainer_state.pt"):
        ckpts.save(2, model, opt, sched, {"train_time_s": 1.0})
    assert sorted(p.name for p in ckpts.root.iterdir()) == ["step-0000001"]


class Planted:
    """A pickle that runs code when loaded with weights_only=False (it writes a canary)."""

    def __init__(self, canary: str) -> None:
        self.canary = canary

    def __reduce__(self):
        return (open, (self.canary, "a"))  # opening for append creates the canary, nothing else


def test_a_planted_trainer_state_is_refused_and_runs_nothing(tmp_path):
    out = tmp_path / "run"
    train_sft(tiny(steps=1), out, progress=False)
    state = out / "checkpoints" / "step-0000001" / run_dir.STATE
    real = torch.load(state, weights_only=True)
    canary = tmp_path / "canary"
    torch.save({**real, "rng": Planted(str(canary))}, state)
    with pytest.raises(CheckpointError, match=f"^{state}: refused"):
        train_sft(tiny(steps=2), out, resume=True, progress=False)
    assert not canary.exists()


def test_a_real_trainer_state_resumes_under_weights_only(tmp_path):
    out = tmp_path / "run"
    train_sft(tiny(steps=1), out, progress=False)
    res = train_sft(tiny(steps=2), out, resume=True, progress=False)
    assert res.step == 2 and sorted(res.losses) == [2]
