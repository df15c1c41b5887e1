"""Rank 0 does the I/O; every rank runs the same request.

Under torchrun every rank executes the same program (a CLI command, a user's script). `LLM.generate`
calls `share` first: rank 0's request (prompt, chat flag, decoding parameters, whether it has a
`should_stop`) is broadcast, so the ranks decode the same request even if their arguments differ.
The ranks then run the same host loop over replicated state (every combined statistic is
bitwise identical on every rank), so no per-round broadcast of tokens is needed; cancellation is
rank 0's decision, broadcast at each poll (`shared_stop`). A server runs HTTP on rank 0 only; the
other ranks call `follow`, which decodes whatever rank 0 sends until rank 0 sends `None` (`stop`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dlmrt.parallel.group import TPGroup

log = logging.getLogger("dlmrt")


def share(group: TPGroup, request: dict[str, Any] | None) -> dict[str, Any] | None:
    """Rank 0's request on every rank (None: no more requests)."""
    return group.broadcast_object(request)


def shared_stop(group: TPGroup, should_stop: Callable[[], bool] | None) -> Callable[[], bool]:
    """A poll every rank calls at the same point; rank 0's `should_stop` decides."""

    def poll() -> bool:
        mine = bool(should_stop()) if group.is_root and should_stop is not None else False
        return group.broadcast_flag(mine)

    return poll


def follow(group: TPGroup, run: Callable[[dict[str, Any]], Any]) -> None:
    """Ranks > 0: run every request rank 0 shares until it shares None."""
    if group.is_root:
        raise RuntimeError("follow: rank 0 serves the requests; only ranks > 0 follow")
    while (request := share(group, None)) is not None:
        try:
            run(request)
        except Exception as e:  # the same bad request fails on rank 0, which reports it
            log.debug("rank %d: request failed: %s", group.rank, e)


_RELEASED: set[int] = set()  # groups whose followers rank 0 has released (a second stop: no-op)


def stop(group: TPGroup) -> None:
    """Rank 0: release the followers (they return from `follow`); once per group."""
    if group.is_root and id(group) not in _RELEASED:
        _RELEASED.add(id(group))
        share(group, None)


def share_call(
    group: TPGroup, prompt: Any, chat: bool, kwargs: dict[str, Any], should_stop
) -> tuple[Any, bool, dict[str, Any], Callable[[], bool] | None]:
    """`LLM.generate`'s arguments as rank 0 gave them (`should_stop` becomes the shared poll)."""
    req = share(
        group, {"prompt": prompt, "chat": chat, "kwargs": kwargs, "poll": should_stop is not None}
    )
    return unpack(group, req, should_stop)


def unpack(group: TPGroup, req: dict[str, Any], should_stop=None):
    """(prompt, chat, kwargs, should_stop) of a shared request."""
    poll = shared_stop(group, should_stop) if req["poll"] else None
    return req["prompt"], req["chat"], req["kwargs"], poll


def root_only(llm: Any, main: Callable[[], int]) -> int:
    """Run a command's `main` on rank 0 (all the I/O) while the other ranks follow its requests;
    rank 0 releases them however `main` ends. Without tensor parallelism: just `main()`."""
    group = llm.group
    if group is not None and not group.is_root:
        llm.follow()
        return 0
    try:
        return main()
    finally:
        llm.release_followers()
