"""One thread per stream that waits, in order, on the stream's events and runs their callbacks.

Backend-neutral (an event is anything with a blocking ``sync()``), so it runs on the simulator's
tests too. It never calls a callback while holding a lock, never lets a callback's exception kill
the thread, and keeps no reference to an event or callback once it ran: a callback may hold a
batch's responses, and with them their device memory.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["StreamWaiter"]

log = logging.getLogger("aiocubie")


class _Syncable(Protocol):
    def sync(self) -> Any: ...


class StreamWaiter:
    """A daemon thread that waits, in order, on the events of one stream and runs their callbacks.

    Events of one stream complete in the order they were recorded, so a FIFO per stream never
    holds a completed event behind a pending one of another stream.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[_Syncable, Callable[[], None]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=_run, args=(self._queue,), name=name, daemon=True)
        self._thread.start()

    def submit(self, event: _Syncable, callback: Callable[[], None]) -> None:
        """Run ``callback`` once ``event.sync()`` returns (or raises: a device error)."""
        self._queue.put((event, callback))

    def stop(self) -> None:
        """Finish the queued waits (their events must be able to complete), then end the thread."""
        self._queue.put(None)
        self._thread.join()


def _run(waits: queue.SimpleQueue[tuple[_Syncable, Callable[[], None]] | None]) -> None:
    while True:
        item = waits.get()
        if item is None:
            return
        _wait_and_call(*item)
        # the thread's frame would hold the last item until the next arrives: a batch's
        # responses (and their memory) kept for as long as the stream stays quiet
        del item


def _wait_and_call(event: _Syncable, callback: Callable[[], None]) -> None:
    try:
        event.sync()  # a GPU event needs no current context: it knows its own
    except Exception:  # a device error: the callback still runs, and query() raises it
        log.debug("aiocubie: waiting for an event failed", exc_info=True)
    try:
        callback()
    except Exception:  # a callback's bug must not kill the waiting thread
        log.exception("aiocubie: an event callback raised")
