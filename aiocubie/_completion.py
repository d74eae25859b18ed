"""The completion bridge: a backend :class:`Event` -> an awaitable, on asyncio or trio.

Backends call back from any thread when the device reaches an event; the bridge hands the
wake-up to the loop thread with the loop's own thread-safe call. It never blocks the loop and
never polls. It imports no device library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel

from ._backends import Event

__all__ = ["thread_safe_caller", "wait_event"]


def thread_safe_caller() -> Callable[[Callable[[], None]], None]:
    """Return a function that runs a callable in the current event loop, from any thread.

    asyncio's ``loop.call_soon_threadsafe`` or trio's ``TrioToken.run_sync_soon``: both wake
    a sleeping loop through its self-pipe, which is the cheapest wake-up each loop has.
    """
    native: Any = anyio.lowlevel.current_token().native_token
    call_soon = getattr(native, "call_soon_threadsafe", None) or native.run_sync_soon
    return call_soon  # type: ignore[no-any-return]


async def wait_event(event: Event) -> None:
    """Wait until ``event`` completes, without blocking the loop.

    Cancellation is safe at any point: a late callback sets an event nobody waits on.
    """
    if event.query():  # already done: skip the cross-thread hop
        await anyio.lowlevel.checkpoint()
        return
    done = anyio.Event()
    call_soon = thread_safe_caller()

    def on_done() -> None:
        try:
            call_soon(done.set)
        except RuntimeError:  # the loop has closed: nobody is left waiting
            pass

    event.add_done_callback(on_done)
    await done.wait()
