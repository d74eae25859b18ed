"""The ticket's state machine: each transition, and what it hands back to release."""

from __future__ import annotations

import pytest

from aiocubie import ArrayResponse
from aiocubie._requests import RequestSet
from aiocubie._stats import Counters
from aiocubie._tickets import State, Ticket
from aiocubie.errors import AllocationError


def ticket() -> Ticket:
    return Ticket(1, RequestSet({}, 0, 0, 0), (Counters(), Counters()))


def response() -> ArrayResponse:
    return ArrayResponse({}, 1, 0, 0, {}, {}, None)


def test_the_happy_path() -> None:
    t, r = ticket(), response()
    assert t.pending and not t.done
    t.allocate(r)
    assert t.state is State.ALLOCATED and not t.done
    assert t.ready() is None
    assert t.state is State.READY and t.done and t.result() is r


def test_an_ordered_ticket_is_ready_once_allocated() -> None:
    t, r = Ticket(1, RequestSet({}, 0, 0, 0), (Counters(), Counters()), ordered=True), response()
    t.allocate(r)  # usable by work queued on the stream from now on: nothing waits for the event
    assert t.state is State.READY and t.done and t.result() is r
    assert t.ready() is None and t.state is State.READY  # the batch's event, reached later, changes nothing
    assert t.cancel() is r  # cancelled at its last checkpoint: nobody will take it


def test_fail_hands_back_an_allocated_response_and_raises_a_copy() -> None:
    t, r = ticket(), response()
    t.allocate(r)
    error = AllocationError("boom")
    assert t.fail(error) is r
    assert t.state is State.FAILED and t.response is None
    with pytest.raises(AllocationError, match="boom") as info:
        t.result()
    assert info.value is not error  # each awaiting task raises its own
    assert t.fail(AllocationError("again")) is None  # ended: left as it is
    assert t.ready() is None and t.cancel() is None


def test_cancel_pending_allocated_and_ready() -> None:
    pending = ticket()
    assert pending.cancel() is None and pending.state is State.CANCELLED

    flying, r = ticket(), response()
    flying.allocate(r)
    assert flying.cancel() is None  # in flight: the device may still write its arrays
    assert flying.ready() is r  # ... so they are handed back when the device is done

    ready, r2 = ticket(), response()
    ready.allocate(r2)
    ready.ready()
    assert ready.cancel() is r2  # nobody will take it: release now
    assert all(c.cancellations == 1 for c in ready.counters)
    assert ready.cancel() is None and ready.counters[0].cancellations == 1
