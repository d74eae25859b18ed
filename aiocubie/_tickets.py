"""A request's way through its group: the ticket, which alone writes its own state.

PENDING (queued, or in a batch being planned) -> ALLOCATED (arrays exist, the device has not
reached the batch's event) -> READY; an ordered ticket is READY as soon as it is allocated. FAILED and CANCELLED end it from PENDING or ALLOCATED;
CANCELLED also ends READY (the awaiting task was cancelled at its last checkpoint). Each
transition says what its caller must release, so no one else touches a ticket's fields.
No device calls, no scheduling: this module only keeps one request's state.
"""

from __future__ import annotations

import copy
import enum
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from ._completion import Signal
from ._errors import AiocubieError
from ._requests import ArrayResponse, RequestSet
from ._stats import Counters

__all__ = ["State", "Ticket"]


class State(enum.Enum):
    """Where a ticket is."""

    PENDING = "pending"  # queued or being planned
    ALLOCATED = "allocated"  # arrays exist; waiting for the device
    READY = "ready"
    FAILED = "failed"
    CANCELLED = "cancelled"


_OPEN = (State.PENDING, State.ALLOCATED)


class _Ended:
    """Awaited, returns at once (what :meth:`Ticket.wait` gives for a ticket that has ended)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()


_ENDED = _Ended()


class Ticket:
    """One ``await mgr.request(...)`` on its way through a group's scheduler.

    Parameters
    ----------
    key : int
        The requesting member's key.
    requests : RequestSet
        The arrays asked for.
    counters : tuple of Counters
        The group's and the member's counters, looked up once (and again by :meth:`regroup`
        when the member moves to another group with the ticket).
    ordered : bool
        Ready as soon as its arrays are allocated (stream-ordered: work on the group's stream
        runs after the allocation), not when the device reaches the batch's event.
    """

    __slots__ = (
        "_signal",
        "counters",
        "enqueued",
        "error",
        "key",
        "leftover",
        "ordered",
        "requests",
        "response",
        "runs",
        "state",
    )

    def __init__(
        self, key: int, requests: RequestSet, counters: tuple[Counters, ...], *, ordered: bool = False
    ) -> None:
        self.key = key
        self.ordered = ordered
        self.requests = requests
        self.runs = requests.runs  # the run length its chunkable arrays share (0: none)
        self.counters = counters
        self.enqueued = time.perf_counter()
        self.leftover = False  # queued when a batch closed without it (cut by size or run length)
        self.state = State.PENDING
        self.response: ArrayResponse | None = None
        self.error: BaseException | None = None
        self._signal: Signal | None = None  # made only when the awaiting task has to sleep

    #: Its priority (higher first): what spilling may not exceed to serve it (s7-prio sets it per request).
    priority = 0

    def __repr__(self) -> str:
        return f"<Ticket {self.key!r} {self.state.value}>"

    @property
    def pending(self) -> bool:
        """True while queued or being planned."""
        return self.state is State.PENDING

    # -- transitions -------------------------------------------------------------------------
    def allocate(self, response: ArrayResponse) -> None:
        """PENDING -> ALLOCATED: the batch's arrays exist; ``response`` holds this ticket's.

        An ordered ticket goes on to READY at once (waking the awaiting task), as :meth:`ready` would.
        """
        assert self.state is State.PENDING, self.state
        self.response = response
        if self.ordered:  # usable by work queued on the stream from now on
            self.state = State.READY
            if self._signal is not None:
                self._signal.set()
        else:
            self.state = State.ALLOCATED

    def ready(self) -> ArrayResponse | None:
        """ALLOCATED -> READY: the device reached the batch's event; wake the awaiting task.

        Returns the response to release if nobody will take it (the ticket was cancelled
        while its arrays were in flight), else None.
        """
        if self.state is State.ALLOCATED:
            self.state = State.READY
            if self._signal is not None:  # _wake, inline: every request passes here
                self._signal.set()
            return None
        return self.response if self.state is State.CANCELLED else None

    def fail(self, error: AiocubieError) -> ArrayResponse | None:
        """End an open ticket with ``error`` (a copy: each awaiting task raises its own).

        Returns the response whose arrays the caller must release (an allocated ticket's), or
        None. A ticket that has ended already is left as it is.
        """
        if self.state not in _OPEN:
            return None
        own = copy.copy(error)
        own.__cause__ = error.__cause__
        held = self.response
        self.error, self.state, self.response = own, State.FAILED, None
        self._wake()
        return held

    def cancel(self) -> ArrayResponse | None:
        """The awaiting task was cancelled: end the ticket.

        Returns the response to release now (a READY ticket's: its arrays exist and nobody
        will see them), else None: an ALLOCATED ticket's arrays are released by
        :meth:`ready` once the device is done with them.
        """
        state = self.state
        if state in _OPEN or state is State.READY:
            self.state = State.CANCELLED
            for counters in self.counters:
                counters.cancellations += 1
            if state is State.READY:
                return self.response
        return None

    def _wake(self) -> None:
        if self._signal is not None:
            self._signal.set()

    def regroup(self, counters: Counters) -> None:
        """The ticket moved to another group (its member did, before it was served): count it,
        and whatever happens to it from now on, in ``counters`` (the new group's) instead."""
        old, *rest = self.counters
        if old is not counters:
            old.requests -= 1
            counters.requests += 1
            self.counters = (counters, *rest)

    # -- the awaiting side -------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once the ticket has ended (ready, failed or cancelled)."""
        return self.state not in _OPEN

    def wait(self, make_signal: Callable[[], Signal]) -> Awaitable[None]:
        """What to await until the ticket ends: a :class:`Signal` from ``make_signal`` (nothing to
        wait for once it has ended). No coroutine of its own: one frame less for a queued request."""
        if self.state in _OPEN:
            signal = self._signal = make_signal()
            return signal
        return _ENDED

    def result(self) -> ArrayResponse:
        """The response of an ended ticket, or its error raised (once: the raiser owns it then).

        A raised error holds its traceback, whose frames hold the caller's locals (its instance
        among them): a ticket still listed somewhere must not keep that alive.
        """
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        assert self.response is not None and self.state is State.READY, self.state
        return self.response
