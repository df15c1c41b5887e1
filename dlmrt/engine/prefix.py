"""Prefix: which of the arena's rows a request may reuse from the requests before it (both styles).

The arena outlives a request. After one, rows [0, n) hold the clean K/V of `ids`, the rows an
encoder-style clean pass wrote: a prefill or a commit. The next request reuses the longest common
prefix of `ids` and its prompt, rounded down to the style's granule, and computes only the rest:

  block style (granule B, the block length): a row's K/V depend on every row of its own block
      (block-causal attention) and blocks sit on absolute multiples of B, so a block whose ids all
      match was computed from exactly the ids a cold prefill sees. Kept: the prompt's prefilled
      blocks, then each generated block whose commit pass, folded or not, has run.
  encoder-decoder style (granule 1): the context arena is written by causal encoder passes, so a
      row's K/V depend only on the tokens at or before it (sliding windows only narrow which):
      any common prefix is exact. Kept: the prompt's rows, then each committed canvas (its
      `advance` pass).

Only committed rows enter `ids`: rows of a block or canvas still being denoised hold scratch K/V
(each round or step rewrites them), so a request cancelled or failed mid-block leaves nothing it
did not commit.

Nothing is copied: this is bookkeeping over the arena the engine already holds. The rows stay
valid while no request writes below `len(ids)` (a request writes only at or after the prefix it
reused), the arena is the same object (growth allocates a new, zeroed one: the engine clears the
prefix first, so no reference here keeps the old arena alive through it), and the granule is
the same (the block style's K/V depend on where a row's block ends). Everything else that shapes
K/V (weights, quantization, KV dtype, tensor-parallel layout) is fixed for the engine's life: a
different one is a different `LLM`, with its own engine and arena (docs/prefix-reuse.md).
"""

from __future__ import annotations

from itertools import takewhile

from dlmrt.parallel.group import active


def common_prefix(held: list[int], prompt: list[int], granule: int) -> int:
    """Rows of the longest common prefix of `held` and `prompt`, rounded down to whole granules."""
    same = sum(1 for _ in takewhile(lambda ab: ab[0] == ab[1], zip(held, prompt, strict=False)))
    return same // granule * granule


class Prefix:
    def __init__(self, enabled: bool = True) -> None:
        """enabled False: `take` always answers 0 and nothing is kept, not even the arena (cold
        prefill every time)."""
        self.enabled = enabled
        self.ids: list[int] = []  # token ids of the arena rows [0, len) whose K/V are final
        self.granule = 0  # the granule those rows were kept at (the block style's block length)
        self.arena: object | None = None  # the arena those rows live in
        self.reused = 0  # prompt rows the latest request reused

    def take(self, prompt: list[int], granule: int, arena: object, limit: int) -> int:
        """Rows of `prompt` the request starting now reuses (whole granules, at most `limit`: the
        rows it would prefill); forgets the held rows past them (the request overwrites them).
        Under tensor parallelism every rank takes the least of the ranks' answers, so they run
        the same prefill (each rank holds at least that prefix)."""
        if not self.enabled:  # every rank: the option is the engine's, the same on each
            self.reused = 0
            return 0
        n = 0
        if arena is self.arena and granule == self.granule:
            n = min(common_prefix(self.ids, prompt, granule), limit)
        n = _agreed(n)
        self.ids = list(prompt[:n])
        self.granule, self.arena, self.reused = granule, arena, n
        return n

    def commit(self, start: int, tokens: list[int]) -> None:
        """Arena rows [start, start + len(tokens)) now hold the final K/V of `tokens` (a prefill
        or a commit). Rows that would leave a gap after the held ones are not kept."""
        if self.enabled and start == len(self.ids):
            self.ids += tokens

    def clear(self) -> None:
        """Forget every held row and the arena (e.g. the model's weights changed in place, or the
        engine grows its arena: the old one must be freed before the new one is allocated)."""
        self.ids, self.arena = [], None


def _agreed(n: int) -> int:
    """The least `n` over the tensor-parallel ranks (n itself without tensor parallelism)."""
    group = active()
    if group is None or group.world == 1:
        return n
    return group.min_over_ranks(n)
