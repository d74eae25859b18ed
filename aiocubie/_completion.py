"""The completion bridge: a backend :class:`Event` -> an awaitable, on asyncio (uvloop) or trio.

A pollable (GPU) event is first polled where the wake-up costs least: by the waiting task itself
between loop iterations for :data:`SPIN`, then by the loop's :class:`Poller`, once a loop
iteration for every pending event, until :data:`POLL` has passed since it was handed over. Only
then is it left to the backend's callback thread, which wakes the loop with the loop's own
thread-safe call: a wake-up from another thread costs a sleeping loop 30-120 us on the H100's VM,
a poll about a microsecond (see docs/performance-notes-wake.md). Nothing here blocks the loop or
holds a lock while it calls back. :class:`Loop` looks the running loop's native primitives up
once, so the request path pays for no backend detection. It imports no device library.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio.lowlevel

from ._protocols import Event

__all__ = ["POLL", "SPIN", "Loop", "Poller", "Signal", "running_loop", "thread_safe_caller", "wait_event"]

log = logging.getLogger("aiocubie")

#: Seconds a waiting task polls its pollable event itself, between loop iterations, before it
#: hands the event to the loop's :class:`Poller` (a task that polls resumes an iteration sooner
#: than one woken by a callback). Other tasks run between polls (each poll is a checkpoint).
SPIN = 200e-6

#: Seconds the loop's :class:`Poller` queries a pending pollable event, once a loop iteration,
#: before it leaves the event to the backend's callback thread. While it polls the loop does not
#: sleep, so this bounds the CPU a wait burns: a wait longer than it costs at most 2 ms of one
#: core (0.2% of a core over one second), and wakes through the thread.
POLL = 2e-3


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


class Poller:
    """Polls the pending pollable events of one event loop, once a loop iteration, in its thread.

    :meth:`watch` hands it an event and what to call when the event completes. Each loop
    iteration while anything is pending, one step queries every pending event (a GPU's
    ``cuEventQuery``: about a microsecond, non-blocking) and calls back for the completed ones; an
    event still pending ``budget`` seconds after it was handed over is left to the backend's
    callback thread (:meth:`~aiocubie._backends.Event.add_done_callback`). Nothing is polled, and
    nothing runs, while nothing is pending. It keeps no reference to an event or callback once it
    called back or handed the event on, and takes no lock.

    Parameters
    ----------
    repeat : callable
        ``repeat(step)`` runs ``step()`` once each loop iteration, in the loop thread, until it
        returns False (see :func:`_asyncio_repeat` and :func:`_trio_repeat`).
    call_soon_threadsafe : callable
        Runs ``f(*args)`` in the loop thread from any thread, doing nothing once the loop closed.
    budget : float
        Seconds an event is polled before it goes to the callback thread (:data:`POLL`).
    """

    __slots__ = ("_armed", "_call_soon_threadsafe", "_pending", "_repeat", "budget")

    def __init__(
        self,
        repeat: Callable[[Callable[[], bool]], None],
        call_soon_threadsafe: Callable[..., Any],
        budget: float = POLL,
    ) -> None:
        self._repeat = repeat
        self._call_soon_threadsafe = call_soon_threadsafe
        self._pending: list[tuple[float, Event, Callable[..., Any], tuple[Any, ...]]] = []
        self._armed = False
        self.budget = budget

    @property
    def pending(self) -> int:
        """How many events are being polled now."""
        return len(self._pending)

    def watch(self, event: Event, func: Callable[..., Any], *args: Any) -> None:
        """Call ``func(*args)`` in the loop thread once ``event`` completes (call it in that thread).

        A pollable event is polled from the next loop iteration on; any other event goes to its
        callback thread at once. ``func`` is called once, never inline from here.
        """
        if not (event.pollable and self.budget > 0):
            self._hand_off(event, func, args)
            return
        self._pending.append((time.perf_counter() + self.budget, event, func, args))
        if not self._armed:
            self._armed = True
            self._repeat(self._step)

    def _hand_off(self, event: Event, func: Callable[..., Any], args: tuple[Any, ...]) -> None:
        call = self._call_soon_threadsafe
        event.add_done_callback(lambda: call(func, *args))

    def _step(self) -> bool:
        """Query every pending event once; True while some are still polled."""
        pending, self._pending = self._pending, []
        now = time.perf_counter()
        done: list[tuple[float, Event, Callable[..., Any], tuple[Any, ...]]] = []
        looked = called = 0  # entries of pending sorted, of done called back
        armed = True  # this step's repeat goes on (until the callbacks, where it may end)
        try:
            for entry in pending:
                deadline, event, func, args = entry
                try:
                    reached = event.query()
                except Exception:  # a device error: the callback runs, and its own query raises it
                    reached = True
                if reached:
                    done.append(entry)
                elif now >= deadline:
                    try:
                        self._hand_off(event, func, args)
                    except Exception:  # the backend refused the wait: call back, the waiter's query raises it
                        done.append(entry)
                else:
                    self._pending.append(entry)
                looked += 1  # (interrupted just before this, an entry is called back twice at worst, never lost)
            # decided before the callbacks: one that watches another event starts a new repeat
            armed = self._armed = bool(self._pending)
            for _, _, func, args in done:
                called += 1
                try:
                    func(*args)
                except Exception:  # a loop callback must not raise: trio would crash the whole run
                    log.exception("aiocubie: an event's completion callback raised")
        except BaseException:
            # a KeyboardInterrupt, or a callback's SystemExit, leaves the loop: what was not called
            # back yet stays polled (completed ones first: called on the next step), from a new repeat
            self._pending[:0] = [*done[called:], *pending[looked:]]
            if armed or not self._armed:  # (a callback that watched an event may have started one)
                self._armed = bool(self._pending)
                if self._armed:
                    self._repeat(self._step)
            raise
        return armed


def _asyncio_repeat(loop: asyncio.AbstractEventLoop) -> Callable[[Callable[[], bool]], None]:
    """``repeat(step)`` for an asyncio loop: one ``call_soon`` callback a loop iteration."""

    def repeat(step: Callable[[], bool]) -> None:
        def again() -> None:
            if step():
                loop.call_soon(again)

        loop.call_soon(again)

    return repeat


def _trio_repeat(step: Callable[[], bool]) -> None:
    """``repeat(step)`` on trio: a system task that steps once a scheduling batch.

    (A ``run_sync_soon`` chain would go through trio's entry queue, which now and then runs a
    millisecond late.)
    """
    import trio

    async def run() -> None:
        while step():
            await trio.lowlevel.checkpoint()

    trio.lowlevel.spawn_system_task(run, name="aiocubie event poller")


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
        self._poller: Poller | None = None

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

    @property
    def poller(self) -> Poller:
        """This loop's :class:`Poller` (made on first use)."""
        poller = self._poller
        if poller is None:
            repeat = _asyncio_repeat(self._loop) if self._loop is not None else _trio_repeat
            poller = self._poller = Poller(repeat, self.call_soon_threadsafe_or_drop)
        return poller

    def watch(self, event: Event, func: Callable[..., Any], *args: Any) -> None:
        """Call ``func(*args)`` in this loop's thread once ``event`` completes (see :class:`Poller`).

        Call it in the loop's thread; ``func`` must not raise (it is logged if it does).
        """
        self.poller.watch(event, func, *args)

    async def wait(self, event: Event, spin: float = SPIN) -> None:
        """Wait until ``event`` completes, without blocking the loop.

        A :attr:`~aiocubie._backends.Event.pollable` event is polled by this task between loop
        iterations for up to ``spin`` seconds (other tasks run meanwhile), then by the loop's
        :class:`Poller` for up to :data:`POLL`, then waited for through the backend's callback.
        Cancellation is safe at any point: a late callback sets a signal nobody waits on.
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
        self.watch(event, signal.set)
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
