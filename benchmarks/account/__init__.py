"""A per-round kernel account: every kernel of one round (or DiffusionGemma step), the op it
belongs to, its µs against the op's floor (`python -m benchmarks.rounds.account`).

- `take.py`: runs the round once eager under torch.profiler with the op labels on
  (`dlmrt/account.py`) and a range around every submodule call (forward hooks, only while taking);
- `events.py`: profiler events -> kernels, each mapped to its innermost label;
- `floors.py`: each label's FLOPs and bytes from the shapes it ran on -> its floor;
- `table.py`: per-kernel rows, per-kind totals sorted by excess time (µs - floor), the round's
  total, as JSON and markdown.
"""
