"""The per-stream waiting thread (a GPU's event callbacks): in order, and nothing kept once run."""

from __future__ import annotations

import gc
import threading
import time
import weakref

from aiocubie._backends._waiter import StreamWaiter


class _Event:
    """An event a test completes: ``sync`` blocks until ``set``."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def set(self) -> None:
        self._done.set()

    def sync(self) -> None:
        self._done.wait(5)


class _Batch:
    """What a scheduler's callback holds: a batch's responses, and with them device memory."""


def test_waiter_keeps_nothing_once_a_callback_ran() -> None:
    waiter = StreamWaiter("test-waiter")
    try:
        batch, event, ran = _Batch(), _Event(), threading.Event()
        gone = weakref.ref(batch)
        waiter.submit(event, lambda batch=batch: ran.set())
        del batch
        event.set()
        assert ran.wait(5)
        deadline = time.monotonic() + 2
        while gone() is not None and time.monotonic() < deadline:  # the thread drops it right after the call
            gc.collect()
            time.sleep(0.01)
        assert gone() is None, "the waiting thread still holds the last callback (and what it holds) while idle"
    finally:
        waiter.stop()


def test_waiter_runs_callbacks_in_order_and_survives_failures() -> None:
    waiter = StreamWaiter("test-waiter")
    order: list[int] = []
    events = [_Event() for _ in range(4)]

    def failing() -> None:
        raise RuntimeError("a callback's bug")

    class _Broken:
        def sync(self) -> None:
            raise RuntimeError("a device error")

    waiter.submit(events[0], lambda: order.append(0))
    waiter.submit(events[1], failing)
    waiter.submit(_Broken(), lambda: order.append(2))  # a failed wait still runs its callback
    waiter.submit(events[3], lambda: order.append(3))
    for event in reversed(events):
        event.set()
    waiter.stop()  # finishes the queued waits first
    assert order == [0, 2, 3]
