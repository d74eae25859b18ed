"""The pinned pool: page-locked host buffers of exactly the sizes asked for, reused.

Sizes are never rounded up (to powers of two or otherwise): a buffer is reused for any request it
covers, and a new one is pinned only when no free buffer does. It holds at most ``KEEP`` (1.1)
times the most ever in use at once: past that it unpins its smallest free buffers, when a buffer
comes back and before it pins a new one. It never frees a buffer that is in use, and it does not
know about streams: callers give a buffer back once the copies that use it are done. A leased
array's finalizer takes no lock (a garbage collection may run it in a thread that holds the
pool's lock): it queues the buffer, and the pool takes it back at its next call or reading.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["KEEP", "PinnedPool"]

#: The pool holds at most this many times the most bytes ever in use at once (``peak_in_use``).
KEEP = 1.1


class PinnedPool:
    """Page-locked ``uint8`` buffers, handed out by best fit and kept for reuse.

    What it gives back, and when: whenever a buffer comes back and ``held`` is then over
    ``KEEP x peak_in_use``, and before pinning a new buffer that would take ``held`` over
    ``KEEP x`` the peak that buffer makes, it unpins free buffers, the smallest first (the
    least likely to serve the next request), until it is under. So at rest it holds at most
    1.1x the most ever staged at once, and free buffers too small for what is asked now go
    first. :meth:`clear` (``mgr.host.release_pinned()``) unpins every free buffer.

    Parameters
    ----------
    allocate : callable
        ``allocate(nbytes)`` pins a new ``uint8`` buffer of exactly ``nbytes`` bytes.

    Attributes
    ----------
    held : int
        Bytes of every buffer the pool holds, in use or free.
    in_use : int
        Bytes asked for by the buffers handed out and not given back (a buffer may be larger
        than what was asked for, when a larger free one was reused).
    peak_in_use : int
        The most ``in_use`` has been since the pool was made or :meth:`reset_peak`.
    pinned : int
        How many buffers the pool has pinned in all (reuse does not count).
    """

    def __init__(self, allocate: Callable[[int], np.ndarray[Any, Any]]) -> None:
        self._allocate = allocate
        self._free: list[tuple[int, int, np.ndarray[Any, Any]]] = []  # (size, id, buffer), sorted
        self._lent: dict[int, tuple[np.ndarray[Any, Any], int]] = {}  # id -> (buffer, asked)
        self._lock = threading.Lock()
        # buffers of collected leases, queued by their finalizers (deque.append is atomic and
        # takes no lock), taken back under the lock by the pool's next call or reading
        self._returned: deque[np.ndarray[Any, Any]] = deque()
        self._held = self._in_use = self._peak_in_use = self._pinned = 0

    @property
    def held(self) -> int:
        """Bytes of every buffer the pool holds, in use or free."""
        self._settle()
        return self._held

    @property
    def in_use(self) -> int:
        """Bytes asked for by the buffers handed out and not given back."""
        self._settle()
        return self._in_use

    @property
    def peak_in_use(self) -> int:
        """The most ``in_use`` has been since the pool was made or :meth:`reset_peak`."""
        self._settle()
        return self._peak_in_use

    @property
    def pinned(self) -> int:
        """How many buffers the pool has pinned in all."""
        return self._pinned

    def acquire(self, nbytes: int) -> np.ndarray[Any, Any]:
        """A page-locked buffer of at least ``nbytes`` bytes (its first ``nbytes`` are yours).

        Raises
        ------
        AllocationError
            If the host cannot pin a new buffer.
        """
        nbytes = max(int(nbytes), 1)
        with self._lock:
            dropped = self._drain()
            at = bisect.bisect_left(self._free, (nbytes, -1))
            buffer = self._free.pop(at)[2] if at < len(self._free) else None
            if buffer is None:  # a miss: the free buffers left are all too small for it
                peak = max(self._peak_in_use, self._in_use + nbytes)
                dropped += self._trim(KEEP * peak - nbytes)
        dropped.clear()  # unpinned as they are collected, outside the lock
        if buffer is None:
            buffer = self._allocate(nbytes)  # outside the lock: pinning takes milliseconds
            with self._lock:
                self._held += buffer.nbytes
                self._pinned += 1
        with self._lock:
            self._lent[id(buffer)] = (buffer, nbytes)
            self._in_use += nbytes
            self._peak_in_use = max(self._peak_in_use, self._in_use)
        return buffer

    def lease(self, nbytes: int) -> np.ndarray[Any, Any]:
        """``nbytes`` page-locked bytes as a ``uint8`` array that gives its buffer back to the
        pool when it and every view of it are collected (not before: a view keeps it).

        numpy points a view's ``base`` at the array that owns the memory, which would be the
        pool's buffer; the array handed out here is made over a small owner of its own, which
        every view keeps alive, and the buffer goes back when that owner is collected.
        """
        buffer = self.acquire(nbytes)
        owner = _Lease(buffer, max(int(nbytes), 0))
        weakref.finalize(owner, self._returned.append, buffer)  # no lock: see _drain
        array: np.ndarray[Any, Any] = np.asarray(owner)
        return array

    def release(self, buffer: np.ndarray[Any, Any]) -> None:
        """Give ``buffer`` back for reuse; nothing may read or write it any more."""
        self._returned.append(buffer)
        self._settle()

    def _settle(self) -> None:
        """Take back the buffers given back since the last call (see :meth:`_drain`)."""
        if self._returned:
            with self._lock:
                dropped = self._drain()
            dropped.clear()  # unpinned as they are collected, outside the lock

    def _drain(self) -> list[np.ndarray[Any, Any]]:
        """Take back every queued buffer (under the lock); return the free ones trimmed to keep.

        Finalizers and :meth:`release` queue the buffers: a finalizer may run in any thread at
        any allocation (a garbage collection), that one holding the lock included, so it must not
        take the lock itself.
        """
        returned, lent = self._returned, self._lent
        if not returned:
            return []
        while returned:
            buffer = returned.popleft()
            entry = lent.pop(id(buffer), None)
            if entry is None:
                continue
            self._in_use -= entry[1]
            bisect.insort(self._free, (buffer.nbytes, id(buffer), buffer))
        return self._trim(KEEP * self._peak_in_use)

    def _trim(self, limit: float) -> list[np.ndarray[Any, Any]]:
        """Take free buffers out, the smallest first, until ``held <= limit`` (under the lock)."""
        dropped: list[np.ndarray[Any, Any]] = []
        free = self._free
        while free and self._held > limit:
            size, _, buffer = free.pop(0)
            self._held -= size
            dropped.append(buffer)
        return dropped

    def clear(self) -> int:
        """Unpin every free buffer (buffers in use stay); return the bytes released."""
        with self._lock:
            dropped = self._drain()
            free, self._free = self._free, []
            released = sum(size for size, _, _ in free)
            self._held -= released
        dropped.clear()
        return released

    def reset_peak(self) -> None:
        """Start measuring :attr:`peak_in_use` again from what is in use now."""
        with self._lock:
            dropped = self._drain()
            self._peak_in_use = self._in_use
        dropped.clear()


class _Lease:
    """The owner of a leased pool buffer's memory, as numpy sees it (``__array_interface__``)."""

    __slots__ = ("__array_interface__", "__weakref__", "base")

    def __init__(self, buffer: np.ndarray[Any, Any], nbytes: int) -> None:
        self.base = buffer  # as an ndarray's base: who asks what memory this is follows it
        self.__array_interface__ = {
            "data": (buffer.ctypes.data, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }
