"""DraftStream: `LLM.stream()`'s iterator over a request's drafts, the request in a thread.

The request runs on a worker thread with `on_round` feeding a queue; iterating yields the drafts
as the engine hands them over (a block at a time) and, once exhausted, `output` holds the
`GenerationOutput`. Leaving early (`close()`, or the `with` block) cancels the request at its next
poll of `should_stop` and waits for the thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from dlmrt.drafts import Draft
from dlmrt.outputs import GenerationOutput


class _End:
    def __init__(self, output: GenerationOutput | None, error: BaseException | None) -> None:
        self.output, self.error = output, error


class DraftStream:
    """Iterate the drafts of one request; `output` is set when the iteration ends."""

    def __init__(self, generate: Callable[..., GenerationOutput], prompt, kwargs: dict) -> None:
        self.output: GenerationOutput | None = None
        self._items: queue.Queue[Draft | _End] = queue.Queue()
        self._cancel = threading.Event()
        self._ended = False
        args = (generate, prompt, kwargs)
        self._thread = threading.Thread(target=self._run, args=args, name="dlmrt-stream")
        self._thread.daemon = True
        self._thread.start()

    def _run(self, generate, prompt, kwargs: dict[str, Any]) -> None:
        try:
            stop = self._cancel.is_set
            out = generate(prompt, on_round=self._items.put, should_stop=stop, **kwargs)
            self._items.put(_End(out, None))
        except BaseException as e:  # re-raised on the caller's thread
            self._items.put(_End(None, e))

    def __iter__(self) -> DraftStream:
        return self

    def __next__(self) -> Draft:
        if self._ended:
            raise StopIteration
        item = self._items.get()
        if not isinstance(item, _End):
            return item
        self._ended = True
        self._thread.join()
        if item.error is not None:
            raise item.error
        self.output = item.output
        raise StopIteration

    def close(self) -> None:
        """Cancel the request if it still runs, and wait for its thread."""
        self._cancel.set()
        self._thread.join()
        if not self._ended:
            self._ended = True
            while not self._items.empty():
                item = self._items.get()
                if isinstance(item, _End) and item.output is not None:
                    self.output = item.output

    def __enter__(self) -> DraftStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
