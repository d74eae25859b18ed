"""Staging: host threads that fill and empty pinned buffers (:mod:`._pinned`) for the walks.

:func:`stage` runs host copies into and out of such buffers on worker threads (numpy copies
without the GIL) once an event says the buffer is free; it never touches a device.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._device import Event

__all__ = ["Staging", "host_copy", "stage"]


#: Host copies are split in slices of at least this size, at most _COPY_PARTS of them, over the
#: copy threads (numpy releases the GIL). On the H100 VM (16 cores) one thread moves 7-12 GB/s,
#: a 15 MiB chunk in 4-8 slices 27-28 GB/s. In a pageable walk (a pack and an unpack at once, and
#: the copy engines reading and writing host memory too) 4 slices a copy did best: 256 MiB in
#: and out in 25-28 ms, against 26-28 (2 slices), 31-63 (8), 42-46 (16) and 33-35 (1).
_THREADED_COPY = 2 << 20
_COPY_PARTS = 4
_COPY_THREADS = min(16, os.cpu_count() or 1)
#: Staging jobs (each one chunk's host copies, split over the copy threads) at once.
_STAGE_THREADS = 4

_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str, threads: int) -> concurrent.futures.ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(name)
        if pool is None:
            pool = _pools[name] = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=f"aiocubie-{name}")
        return pool


def host_copy(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    """``dst[...] = src``, in slices along the first axis on the copy threads when large (this
    thread takes one slice). Blocks until done."""
    parts = min(_COPY_PARTS, _COPY_THREADS, dst.shape[0] if dst.ndim else 1, max(1, dst.nbytes // _THREADED_COPY))
    if parts <= 1:
        np.copyto(dst, src)
        return
    pool = _pool("copy", _COPY_THREADS - 1)
    bounds = [dst.shape[0] * part // parts for part in range(parts + 1)]
    futures = [pool.submit(np.copyto, dst[lo:hi], src[lo:hi]) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    np.copyto(dst[: bounds[1]], src[: bounds[1]])
    for future in futures:
        future.result()


class Staging(Event):
    """Host copies queued by :func:`stage`: an :class:`Event` the event loop can wait on, done
    when the copies are, and :meth:`result` to raise what a copy raised."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: concurrent.futures.Future[None] = concurrent.futures.Future()

    def query(self) -> bool:
        """True once the copies are done (or failed)."""
        return self._future.done()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the copies are done, from any thread (now, if they are)."""
        self._future.add_done_callback(lambda _: callback())

    def synchronize(self) -> None:
        """Block until the copies are done (without raising what they raised)."""
        concurrent.futures.wait([self._future])

    def result(self) -> None:
        """None once the copies are done; raises what a copy raised."""
        self._future.result()


def stage(copies: Sequence[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]], after: Event | None = None) -> Staging:
    """Run ``dst[...] = src`` for each ``(dst, src)`` of ``copies`` on a staging thread, once
    ``after`` (an event: the copy that last used the buffers) completes, or at once.

    The event loop never copies bytes: it waits on the returned handle when it needs the data.
    """
    staging = Staging()
    future = staging._future

    def run() -> None:
        try:
            for dst, src in copies:
                host_copy(dst, src)
        except BaseException as exc:  # handed to whoever waits on the staging
            future.set_exception(exc)
        else:
            future.set_result(None)

    def submit() -> None:  # quick: an event's callback may run it on the device's waiting thread
        try:
            _pool("stage", _STAGE_THREADS).submit(run)
        except RuntimeError as exc:  # the interpreter is shutting down
            future.set_exception(exc)

    if after is None:
        submit()
    else:
        after.add_done_callback(submit)
    return staging
