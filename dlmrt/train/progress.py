"""The trainer's progress bar (tqdm, imported when a run starts)."""

from __future__ import annotations


def progress_bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc="sft",
        unit="step",
        disable=not enabled,
        dynamic_ncols=True,
    )
