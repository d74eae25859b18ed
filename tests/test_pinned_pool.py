"""The pinned pool: a leased array gives its buffer back when collected, whatever thread holds the lock."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from aiocubie._backends import PinnedPool


def host_pool() -> PinnedPool:
    """A pool over plain host buffers (the pool does not care whether they are pinned)."""
    return PinnedPool(lambda nbytes: np.empty(nbytes, np.uint8))


def test_a_lease_collected_while_its_pool_holds_the_lock_does_not_deadlock() -> None:
    pool = host_pool()
    array: list[Any] = [pool.lease(100)]
    assert pool.in_use == 100

    def collect_under_the_lock() -> None:
        # a garbage collection that runs the lease's finalizer inside one of the pool's own
        # calls: the finalizer runs in the thread that holds the (non-reentrant) lock
        with pool._lock:
            array.clear()  # the last reference: the finalizer runs here, now

    thread = threading.Thread(target=collect_under_the_lock, daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive(), "the lease's finalizer waited for the lock its own thread holds"
    assert pool.in_use == 0 and pool.held == 100  # taken back at the next reading
    again = pool.lease(60)  # the free buffer serves the next lease
    assert pool.pinned == 1 and pool.in_use == 60 and again.nbytes == 60


def test_a_released_buffer_is_reused_and_trimmed_to_keep() -> None:
    pool = host_pool()
    small, large = pool.acquire(10), pool.acquire(1000)
    pool.release(small)
    pool.release(large)
    assert (pool.in_use, pool.peak_in_use, pool.pinned) == (0, 1010, 2)
    assert pool.acquire(500) is large and pool.in_use == 500
    assert pool.clear() == 10 and pool.held == 1000
