"""The loop's event poller (aiocubie._completion.Poller) on asyncio, uvloop and trio.

Pollable events are the simulator's own, completed by the test after a number of queries or from
another thread; the poller's logic is backend-neutral, so what runs here is what runs on a GPU.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref
from typing import Any

import anyio
import pytest

from aiocubie import ArrayRequest, MemoryManager
from aiocubie._backends._sim import SimEvent
from aiocubie._completion import Loop, running_loop
from aiocubie.errors import BackendError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio
HANG_GUARD = 5.0


@pytest.fixture(params=["asyncio", "uvloop", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
        return "asyncio", {"use_uvloop": True}
    return str(request.param), {}


class Polled(SimEvent):
    """A pollable event completed after ``after`` queries, or by :meth:`complete` from any thread;
    with ``fail`` its queries raise. Counts its queries and its callback-thread hand-offs."""

    pollable = True

    def __init__(self, after: int | None = None) -> None:
        super().__init__()
        self.after, self.queries, self.handed, self.fail = after, 0, 0, False

    def query(self) -> bool:
        self.queries += 1
        if self.fail:
            raise BackendError("the device failed")
        if self.after is not None and self.queries > self.after and not super().query():
            self.complete()
        return super().query()

    def add_done_callback(self, callback):  # type: ignore[no-untyped-def]
        self.handed += 1
        super().add_done_callback(callback)


def _loop(budget: float = HANG_GUARD) -> Loop:
    """The running loop's Loop, its poller's budget long enough that a slow machine never runs past it
    (an event that completes only by being queried would hang once handed to the callback thread)."""
    loop = running_loop()
    loop.poller.budget = budget
    return loop


async def _until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(HANG_GUARD):
        while not predicate():
            await anyio.sleep(0)
    assert predicate(), what


async def test_a_pollable_event_is_polled_to_completion_without_the_callback_thread() -> None:
    loop = _loop()
    event, called = Polled(after=3), []
    loop.watch(event, called.append, threading.get_ident())
    assert not called, "never called back inline"
    await _until(lambda: called, "called back")
    assert called == [threading.get_ident()], "called once, in the loop thread"
    assert event.handed == 0 and event.queries == 4  # one query a loop iteration, none after
    for _ in range(5):
        await anyio.sleep(0)
    assert event.queries == 4 and loop.poller.pending == 0


async def test_many_events_one_poll_each_a_loop_iteration() -> None:
    loop = _loop()
    events = [Polled(after=i % 7) for i in range(50)]
    called: list[int] = []
    for i, event in enumerate(events):
        loop.watch(event, called.append, i)
    await _until(lambda: len(called) == 50, "every event called back")
    assert sorted(called) == list(range(50))
    assert all(e.queries == e.after + 1 and e.handed == 0 for e in events)  # type: ignore[operator]


async def test_an_event_past_the_budget_goes_to_the_callback_thread_and_polling_stops() -> None:
    loop = _loop(0.01)
    event, called = Polled(), []  # completes only when the test says so
    loop.watch(event, called.append, 1)
    await _until(lambda: event.handed, "handed to the callback thread")
    polled = event.queries
    assert polled > 1 and loop.poller.pending == 0
    await anyio.sleep(0.02)
    assert event.queries == polled, "polling must stop at the budget"
    assert not called
    threading.Thread(target=event.complete).start()
    await _until(lambda: called, "woken by the callback thread")
    assert called == [1]


async def test_an_event_that_is_not_pollable_goes_to_its_callback_at_once() -> None:
    loop = _loop()
    event = Polled()
    event.pollable = False
    called: list[int] = []
    loop.watch(event, called.append, 1)
    assert event.handed == 1 and event.queries == 0 and loop.poller.pending == 0
    event.complete()
    await _until(lambda: called, "called back through the loop's thread-safe call")


async def test_a_failing_query_calls_back_and_spares_the_others() -> None:
    loop = _loop()
    bad, good, called = Polled(), Polled(after=10), []
    bad.fail = True
    loop.watch(bad, called.append, "bad")
    loop.watch(good, called.append, "good")
    await _until(lambda: len(called) == 2, "both called back")
    assert called == ["bad", "good"]  # the failing one first: its waiter finds the error itself


async def test_a_hand_off_the_backend_refuses_calls_back_and_the_poller_goes_on() -> None:
    class Refused(Polled):
        def add_done_callback(self, callback):  # type: ignore[no-untyped-def]
            raise BackendError("the device failed")

    loop = _loop(0.001)
    called: list[str] = []
    loop.watch(Refused(), called.append, "refused")  # never completes: past the budget, refused
    await _until(lambda: called, "called back")
    loop.poller.budget = HANG_GUARD
    loop.watch(Polled(after=1), called.append, "next")  # the poller still runs
    await _until(lambda: len(called) == 2, "the next one called back")
    assert called == ["refused", "next"]


async def test_a_raising_callback_is_logged_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    loop = _loop()
    called: list[int] = []

    def boom() -> None:
        raise RuntimeError("a callback's bug")

    with caplog.at_level(logging.ERROR, logger="aiocubie"):
        loop.watch(Polled(after=1), boom)
        loop.watch(Polled(after=1), called.append, 2)
        await _until(lambda: called, "the other one called back")
    assert "completion callback raised" in caplog.text


async def test_a_callback_may_watch_another_event() -> None:
    loop = _loop()
    second, called = Polled(after=2), []
    loop.watch(Polled(after=1), lambda: loop.watch(second, called.append, 2))
    await _until(lambda: called, "the second event called back")
    assert called == [2]


async def test_no_reference_is_kept_to_a_completed_callback() -> None:
    class Batch:
        def done(self) -> None:
            pass

    loop = _loop()
    batch = Batch()
    gone = weakref.ref(batch)
    event = Polled(after=1)
    loop.watch(event, batch.done)
    del batch
    await _until(lambda: event.queries >= 2, "completed")
    for _ in range(3):
        await anyio.sleep(0)
    gc.collect()
    assert gone() is None, "the poller kept the batch"


async def test_a_request_on_a_pollable_event_resolves_by_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's batch in flight goes to the poller: no callback thread when the event is reached in time."""
    handed: list[int] = []
    monkeypatch.setattr(SimEvent, "pollable", True)
    original = SimEvent.add_done_callback
    monkeypatch.setattr(SimEvent, "add_done_callback", lambda self, cb: (handed.append(1), original(self, cb))[1])
    # the first query finds the event still pending (the simulated stream's thread completes it
    # 100 us later); the next waits for it: completion found by polling, whatever the machine's pace
    queried: dict[int, int] = {}
    plain_query = SimEvent.query

    def query(self: SimEvent) -> bool:
        seen = queried[id(self)] = queried.get(id(self), 0) + 1
        if seen > 1:
            self.synchronize()
        return plain_query(self)

    monkeypatch.setattr(SimEvent, "query", query)
    sim = SimulatorBackend(1 << 24, latency=1e-4)
    async with MemoryManager(sim, batch_window=0) as mgr:
        owner = object()
        mgr.register(owner)
        with anyio.fail_after(HANG_GUARD):
            for _ in range(20):
                response = await mgr.request(owner, {"a": ArrayRequest((1000,), "float32")})
                assert response.ready.query()
                mgr.release(response)
    assert max(queried.values()) > 1, "polled"
    assert not handed, "resolved by polling, never through the callback thread"
    assert sim.used == 0


def _loop_factories() -> list[Any]:
    factories: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return factories
    return [*factories, pytest.param(uvloop.new_event_loop, id="uvloop")]


@pytest.mark.parametrize("new_loop", _loop_factories())
def test_a_callback_that_raises_a_base_exception_leaves_the_poller_polling(new_loop: Any) -> None:
    """A SystemExit (a ready hook's sys.exit()) or a KeyboardInterrupt out of a completion callback
    leaves the loop; run again, the loop's poller must still serve the events left pending and new ones
    (stuck armed with no repeat, it would neither poll them nor hand them on: every wait hangs)."""
    native = new_loop()
    left, later, called = Polled(after=3), Polled(after=1), []

    def interrupt() -> None:
        raise SystemExit(3)

    async def first() -> None:
        loop = _loop()
        loop.watch(Polled(after=1), called.append, "before")
        loop.watch(Polled(after=1), interrupt)
        loop.watch(Polled(after=1), called.append, "after")  # completed in the same step: called on the next
        loop.watch(left, called.append, "left")
        await asyncio.sleep(HANG_GUARD)

    async def second() -> None:
        loop = _loop()
        loop.watch(later, called.append, "later")
        await asyncio.wait_for(_until(lambda: len(called) == 4, "every other callback called"), HANG_GUARD)

    try:
        with pytest.raises(SystemExit):
            native.run_until_complete(first())
        native.run_until_complete(second())
        assert called == ["before", "after", "left", "later"]
        assert left.handed == later.handed == 0  # still polled, not left to the callback thread
    finally:
        for task in asyncio.all_tasks(native):
            task.cancel()
        native.run_until_complete(asyncio.sleep(0))
        native.close()
