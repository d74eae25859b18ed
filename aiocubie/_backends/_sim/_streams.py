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

    __slots__ = ("__weakref__", "done", "later", "lock", "queued")

    def __init__(self) -> None:
        self.queued = self.done = 0
        self.lock = threading.Lock()
        self.later: list[tuple[int, Callable[[], None]]] = []  # (items done by then, callback), in order

    def wait_idle(self) -> None:
        """Block until the items queued so far are done (the worker's own thread must not call this)."""
        idle = threading.Event()
        with self.lock:
            if self.done >= self.queued:
                return
            self.later.append((self.queued, idle.set))
        idle.wait()

    def reached(self) -> list[Callable[[], None]]:
        """The callbacks the item being finished reaches (call them outside the lock, then :meth:`finish`)."""
        with self.lock:
            return self._take(self.done + 1)

    def finish(self) -> list[Callable[[], None]]:
        """Count the item done, once its callbacks ran; those registered while they ran (call them too).

        Counted after the callbacks: a thread that finds the stream idle finds what they freed freed.
        """
        with self.lock:
            self.done += 1
            return self._take(self.done)

    def _take(self, done: int) -> list[Callable[[], None]]:
        later = self.later
        if not later or later[0][0] > done:
            return []
        self.later = [(at, callback) for at, callback in later if at > done]
        return [callback for at, callback in later if at <= done]


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
        if threading.current_thread() is self._worker:
            return
        self._progress.wait_idle()

    @property
    def progress(self) -> _Progress:
        """What its worker has done: held by the worker, so it outlives a stream dropped with work queued."""
        return self._progress

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
        # dropped before the callbacks, each before the next: one may wake a thread that counts
        # what is still held (a copy holds its arrays; a stream-ordered free, its block)
        del work
        _call(progress.reached())
        _call(progress.finish())


def _call(callbacks: list[Callable[[], None]]) -> None:
    callbacks.reverse()
    while callbacks:
        callback = callbacks.pop()
        try:
            callback()
        except Exception:
            log.exception("simulated stream callback failed")
        del callback


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
