"""The completion bridge: a backend :class:`Event` -> an awaitable, on asyncio (uvloop) or trio.

Backends call back from any thread when the device reaches an event; the bridge hands the
wake-up to the loop thread with the loop's own thread-safe call. It never blocks the loop and
never polls. :class:`Loop` looks the running loop's native primitives up once, so the request
path pays for no backend detection. It imports no device library.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio.lowlevel

from ._backends import Event

__all__ = ["Loop", "Signal", "thread_safe_caller", "wait_event"]


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
    """

    def __init__(self) -> None:
        native: Any = anyio.lowlevel.current_token().native_token
        if isinstance(native, asyncio.AbstractEventLoop):
            self.call_soon_threadsafe: Callable[..., Any] = native.call_soon_threadsafe
            self._loop: asyncio.AbstractEventLoop | None = native
        else:
            self.call_soon_threadsafe = native.run_sync_soon
            self._loop = None

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

    async def wait(self, event: Event) -> None:
        """Wait until ``event`` completes, without blocking the loop.

        Cancellation is safe at any point: a late callback sets a signal nobody waits on.
        """
        if event.query():  # already done: skip the cross-thread hop
            await self.checkpoint()
            return
        signal = self.signal()
        event.add_done_callback(lambda: self.call_soon_threadsafe_or_drop(signal.set))
        await signal


@types.coroutine
def _yield_once() -> Generator[None, None, None]:
    yield  # a bare yield from a task: asyncio runs the task again on the next loop iteration


def thread_safe_caller() -> Callable[..., Any]:
    """Return a function that runs a callable in the current event loop, from any thread."""
    return Loop().call_soon_threadsafe


async def wait_event(event: Event) -> None:
    """Wait until ``event`` completes, without blocking the loop (see :meth:`Loop.wait`)."""
    await Loop().wait(event)
