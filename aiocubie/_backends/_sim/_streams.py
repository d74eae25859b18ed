"""The simulator's streams and events: a worker thread per stream runs queued work in order.

An event completes when the stream's worker reaches it, so only after the work queued before
it. Nothing here knows about memory, engines or faults (the simulator's device does).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable

from ..._errors import BackendError
from .._device import Event

__all__ = ["SimEvent", "SimStream", "on_worker"]

log = logging.getLogger("aiocubie")

#: ``.on`` is True in a stream's worker thread: what runs there is an engine's work.
_worker = threading.local()


def on_worker() -> bool:
    """True when called from a simulated stream's worker (work an engine runs), not from the host."""
    return getattr(_worker, "on", False)


class _Progress:
    """Items queued on a stream and items its worker finished: equal when the stream is idle."""

    __slots__ = ("done", "later", "lock", "queued")

    def __init__(self) -> None:
        self.queued = self.done = 0
        self.lock = threading.Lock()
        self.later: list[tuple[int, Callable[[], None]]] = []  # (items done by then, callback), in order

    def finished(self) -> list[Callable[[], None]]:
        """Count an item done; the callbacks it reaches (call them outside the lock)."""
        with self.lock:
            self.done += 1
            later, done = self.later, self.done
            if not later or later[0][0] > done:
                return []
            reached = [callback for at, callback in later if at <= done]
            self.later = [(at, callback) for at, callback in later if at > done]
            return reached


class SimStream:
    """A simulated stream: a worker thread that runs queued work in order.

    ``handle`` is a stand-in for a CUstream (never 0, 1 or 2), reported by the simulator's
    arrays in their ``__cuda_array_interface__``.
    """

    _ids = itertools.count()

    def __init__(self, latency: float) -> None:
        self.id = next(self._ids)
        self.handle = 0x5100 + self.id
        self.latency = latency
        self.closed = False
        self._closed_by = ""  # why, for the error of work queued after the close
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._progress = _Progress()
        # The worker holds the queue, not the stream: a stream nobody holds any more is
        # collected, and its finalizer stops the worker.
        self._worker = threading.Thread(
            target=_work,
            args=(self._queue, latency, self._progress),
            name=f"aiocubie-sim-stream-{self.id}",
            daemon=True,
        )
        self._worker.start()
        weakref.finalize(self, self._queue.put, None)

    def __repr__(self) -> str:
        return f"<SimStream {self.id}>"

    def __int__(self) -> int:
        return self.handle

    def __cuda_stream__(self) -> tuple[int, int]:
        """The stream protocol (version 0, the stand-in handle), as cuda.core's streams have."""
        return (0, self.handle)

    @property
    def pending(self) -> int:
        """Work items queued and not yet finished (0: the stream is idle)."""
        progress = self._progress
        return progress.queued - progress.done

    def enqueue(self, work: Callable[[], None]) -> None:
        """Queue ``work`` to run after everything queued before it, ``latency`` seconds later."""
        if self.closed:
            raise BackendError(f"{self!r} was closed {self._closed_by}")
        with self._progress.lock:
            self._progress.queued += 1
        self._queue.put(work)

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the work queued so far is done: now when the stream is idle, else
        on the worker right after that work (it takes no place in the queue: :attr:`pending` and
        the events queued later do not wait for it)."""
        progress = self._progress
        with progress.lock:
            if progress.done < progress.queued:
                progress.later.append((progress.queued, callback))
                return
        callback()

    def synchronize(self) -> None:
        """Block until the work queued so far is done (at once when the stream is idle).

        A no-op on the stream's own worker (the work before the caller is done). On a closed
        stream it waits for the worker to finish what was queued before the close, as a
        real stream's copies still land after a reset: whoever frees their buffers waits here.
        """
        progress = self._progress
        if progress.queued == progress.done or threading.current_thread() is self._worker:
            return
        if self.closed:
            self._worker.join()
            return
        done = threading.Event()
        self.enqueue(done.set)
        done.wait()

    def close(self, why: str) -> None:
        """Stop the worker after the work queued so far; work queued later is refused, saying ``why``
        (what closed it and what to do)."""
        if not self.closed:
            self.closed = True
            self._closed_by = why
            self._queue.put(None)


def _work(work_queue: queue.SimpleQueue[Callable[[], None] | None], latency: float, progress: _Progress) -> None:
    _worker.on = True
    while (work := work_queue.get()) is not None:
        if latency:
            time.sleep(latency)
        try:
            work()
        except Exception:  # keep the stream alive: what is queued behind must still run
            log.exception("simulated stream work failed")
        finally:
            for callback in progress.finished():
                try:
                    callback()
                except Exception:
                    log.exception("simulated stream callback failed")


class SimEvent(Event):
    """An event on a :class:`SimStream`: done once the worker reaches it."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._done.wait()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def complete(self) -> None:
        """Mark the event done and call its callbacks (the stream's worker does, in order)."""
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
