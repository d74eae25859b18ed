"""The completion bridge: a backend :class:`Event` -> an awaitable, on asyncio (uvloop) or trio.

Backends call back from any thread when the device reaches an event; the bridge hands the
wake-up to the loop thread with the loop's own thread-safe call. An event about to complete is
first polled for a short while between loop iterations (:data:`SPIN`), which spares the thread
hop; it never blocks the loop. :class:`Loop` looks the running loop's native primitives up once,
so the request path pays for no backend detection. It imports no device library.
"""

from __future__ import annotations

import asyncio
import threading
import time
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio.lowlevel

from ._protocols import Event

__all__ = ["SPIN", "Loop", "Signal", "running_loop", "thread_safe_caller", "wait_event"]

#: Seconds :meth:`Loop.wait` polls a pollable event between loop iterations before it hands the wait to
#: the backend's callback thread. A wake-up through that thread and the loop's self-pipe costs
#: tens of microseconds of latency and host time a wait; a batch's copies and kernel often end
#: sooner. Other tasks run between polls (each poll is a checkpoint), so the loop never blocks.
SPIN = 200e-6


class Signal:
    """A one-shot wake-up, set from the loop thread and awaited by one task (cancellable)."""

    __slots__ = ()

    def set(self) -> None:
        """Wake the waiting task (or let a later wait return at once). Idempotent."""
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, None]:
        raise NotImplementedError


class _AsyncioSignal(Signal):
    # A bare future: the cheapest thing an asyncio task can sleep on (an anyio.Event builds
    # an asyncio.Event and a future on every wait, about twice the cost).
    __slots__ = ("_future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._future = loop.create_future()

    def set(self) -> None:
        if not self._future.done():  # cancelled with its waiter, or set already
            self._future.set_result(None)

    def __await__(self) -> Generator[Any, None, None]:
        return self._future.__await__()


class _TrioSignal(Signal):
    __slots__ = ("_event",)

    def __init__(self) -> None:
        import trio

        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def __await__(self) -> Generator[Any, None, None]:
        return self._event.wait().__await__()


class Loop:
    """The running event loop's native primitives, looked up once (in the loop's thread).

    Attributes
    ----------
    call_soon_threadsafe : callable
        Runs ``f(*args)`` in the loop thread, from any thread: asyncio's
        ``loop.call_soon_threadsafe`` or trio's ``TrioToken.run_sync_soon``. Both wake a
        sleeping loop through its self-pipe, the cheapest wake-up each loop has.
    thread : int
        ``threading.get_ident()`` of the loop's thread: one event loop runs in a thread at a
        time, so code running in another thread is on another loop (one cheap comparison).
    """

    def __init__(self) -> None:
        native: Any = anyio.lowlevel.current_token().native_token
        if isinstance(native, asyncio.AbstractEventLoop):
            self.call_soon_threadsafe: Callable[..., Any] = native.call_soon_threadsafe
            self._loop: asyncio.AbstractEventLoop | None = native
        else:
            self.call_soon_threadsafe = native.run_sync_soon
            self._loop = None
        self.thread = threading.get_ident()
        self._native = native
        self._thread_name = threading.current_thread().name

    def __repr__(self) -> str:
        kind = type(self._native).__name__ if self._loop is not None else "trio"
        return f"<{kind} event loop {id(self._native):#x} in thread {self._thread_name!r}>"

    def foreign(self) -> str | None:
        """None in this loop's thread; elsewhere, a sentence naming this loop for an error."""
        if threading.get_ident() == self.thread:
            return None
        return (
            f"the manager runs on {self!r}, not in thread {threading.current_thread().name!r}: "
            "await its requests from tasks of that loop (hand work over with "
            "anyio.from_thread or asyncio.run_coroutine_threadsafe)"
        )

    def signal(self) -> Signal:
        """A new :class:`Signal` for this loop."""
        return _AsyncioSignal(self._loop) if self._loop is not None else _TrioSignal()

    def checkpoint(self) -> Awaitable[None]:
        """Yield to the loop once: a cancellation point, as anyio's checkpoint is."""
        # on asyncio, what anyio's checkpoint (asyncio.sleep(0)) does, less its lookups and frames
        return _yield_once() if self._loop is not None else anyio.lowlevel.checkpoint()

    def call_soon_threadsafe_or_drop(self, func: Callable[..., Any], *args: Any) -> None:
        """:attr:`call_soon_threadsafe`, doing nothing once the loop has closed (nobody waits)."""
        try:
            self.call_soon_threadsafe(func, *args)
        except RuntimeError:
            pass

    async def wait(self, event: Event, spin: float = SPIN) -> None:
        """Wait until ``event`` completes, without blocking the loop.

        A :attr:`~aiocubie._backends.Event.pollable` event is polled between loop iterations
        for up to ``spin`` seconds (other tasks run meanwhile), then waited for through the
        backend's callback. Cancellation is safe at any point: a late callback sets a signal
        nobody waits on.
        """
        if event.query():  # already done: skip the cross-thread hop
            await self.checkpoint()
            return
        if spin > 0 and event.pollable:
            deadline = time.perf_counter() + spin
            while True:
                await self.checkpoint()
                if event.query():
                    return
                if time.perf_counter() >= deadline:
                    break
        signal = self.signal()
        event.add_done_callback(lambda: self.call_soon_threadsafe_or_drop(signal.set))
        await signal


#: The Loop last made in each thread, handed out again while its asyncio loop runs (see running_loop).
_made = threading.local()


def running_loop() -> Loop:
    """The :class:`Loop` of the event loop running in this thread.

    On asyncio one is made per event loop and thread and handed out again (a walk a batch would
    otherwise look the loop's primitives up on every walk); on trio a new one is made each call.
    """
    try:
        native = asyncio.get_running_loop()
    except RuntimeError:  # trio (or no loop at all: Loop() says so)
        return Loop()
    loop: Loop | None = getattr(_made, "loop", None)
    if loop is None or loop._loop is not native:
        loop = _made.loop = Loop()
    return loop


@types.coroutine
def _yield_once() -> Generator[None, None, None]:
    yield  # a bare yield from a task: asyncio runs the task again on the next loop iteration


def thread_safe_caller() -> Callable[..., Any]:
    """Return a function that runs a callable in the current event loop, from any thread."""
    return Loop().call_soon_threadsafe


async def wait_event(event: Event) -> None:
    """Wait until ``event`` completes, without blocking the loop (see :meth:`Loop.wait`)."""
    await Loop().wait(event)
