"""Tests of the completion bridge: a device event, completed on another thread, as an awaitable.

Run on asyncio and trio. Events are held with a gate on the simulator's stream, so nothing
depends on timing; ``fail_after`` only stops a broken bridge from hanging the suite.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import pytest

from aiocubie import Event
from aiocubie._backends._sim import SimEvent
from aiocubie._completion import running_loop, thread_safe_caller, wait_event
from aiocubie.errors import BackendError
from aiocubie.simulator import SimulatorBackend

HANG_GUARD = 10  # seconds: only a hung test takes this long


@pytest.fixture
def sim() -> Iterator[SimulatorBackend]:
    backend = SimulatorBackend(total=1 << 20)
    yield backend
    backend.close()


def hold(gate: threading.Event) -> None:
    gate.wait(HANG_GUARD)


def gated_event(sim: SimulatorBackend) -> tuple[Event, threading.Event]:
    """An event that completes on the simulator's stream thread once the gate is set."""
    stream = sim.device.create_stream()
    gate = threading.Event()
    stream.enqueue(lambda: hold(gate))
    return sim.device.record_event(stream), gate


@pytest.mark.anyio
async def test_wait_event_resolves_when_another_thread_completes_it(sim: SimulatorBackend) -> None:
    event, gate = gated_event(sim)
    done = anyio.Event()

    async def waiter() -> None:
        await wait_event(event)
        done.set()

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            for _ in range(20):
                await anyio.lowlevel.checkpoint()
            assert not done.is_set(), "the waiter must not resume before the device reaches the event"
            gate.set()
    assert done.is_set() and event.query()


@pytest.mark.anyio
async def test_wait_event_from_a_plain_thread() -> None:
    event = SimEvent()  # on no stream: completed by a plain thread, not a simulator worker
    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_event, event)
            await anyio.lowlevel.checkpoint()
            threading.Thread(target=event.complete).start()
    assert event.query()


@pytest.mark.anyio
async def test_many_waiters_on_one_event(sim: SimulatorBackend) -> None:
    event, gate = gated_event(sim)
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await wait_event(event)
        woken.append(i)

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(waiter, i)
            await anyio.lowlevel.checkpoint()
            gate.set()
    assert sorted(woken) == list(range(100))


@pytest.mark.anyio
async def test_cancelled_wait_is_clean(sim: SimulatorBackend) -> None:
    event, gate = gated_event(sim)
    with anyio.move_on_after(0.02) as scope:
        await wait_event(event)
    assert scope.cancelled_caught
    assert not event.query()
    gate.set()
    with anyio.fail_after(HANG_GUARD):
        await wait_event(event)  # the late callback of the cancelled wait did no harm
    assert event.query()


@pytest.mark.anyio
async def test_already_done_event_returns_and_is_a_checkpoint(sim: SimulatorBackend) -> None:
    event = sim.device.record_event(sim.device.create_stream())
    event.synchronize()
    with anyio.fail_after(HANG_GUARD):
        await wait_event(event)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await wait_event(event)  # a checkpoint: the pending cancellation is delivered here
        pytest.fail("wait_event on a done event must still be a cancellation point")
    assert scope.cancelled_caught


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_late_completion_after_the_loop_closed_is_harmless(sim: SimulatorBackend, backend: str) -> None:
    stream = sim.device.create_stream()
    gate = threading.Event()
    stream.enqueue(lambda: hold(gate))
    event = sim.device.record_event(stream)

    async def main() -> None:
        with anyio.move_on_after(0.01):
            await wait_event(event)

    anyio.run(main, backend=backend)
    gate.set()
    # the bridge's callback runs on the stream thread against a closed loop: had it raised,
    # the thread would be dead and this later event would never complete
    follow_up = threading.Event()
    sim.device.record_event(stream).add_done_callback(follow_up.set)
    assert follow_up.wait(HANG_GUARD)


@pytest.mark.anyio
async def test_thread_safe_caller_runs_in_the_loop() -> None:
    call_soon = thread_safe_caller()
    ran_on: list[threading.Thread] = []
    done = anyio.Event()

    def on_loop() -> None:
        ran_on.append(threading.current_thread())
        done.set()

    worker = threading.Thread(target=call_soon, args=(on_loop,))
    with anyio.fail_after(HANG_GUARD):
        worker.start()
        await done.wait()
    worker.join()
    assert ran_on == [threading.current_thread()]


@pytest.mark.anyio
async def test_the_running_loop_is_looked_up_once_per_asyncio_loop(sim: SimulatorBackend, anyio_backend: str) -> None:
    loop = running_loop()
    assert (running_loop() is loop) is (anyio_backend == "asyncio")  # trio: made each call
    event, gate = gated_event(sim)
    gate.set()
    with anyio.fail_after(HANG_GUARD):
        await loop.wait(event)


def test_a_new_asyncio_loop_in_the_thread_gets_its_own(sim: SimulatorBackend) -> None:
    async def main() -> tuple[object, object]:
        event, gate = gated_event(sim)
        loop = running_loop()
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(loop.wait, event)  # woken through this loop, not the closed one before it
                await anyio.sleep(0.01)
                gate.set()
        return loop, loop.thread

    first, second = anyio.run(main), anyio.run(main)
    assert first[0] is not second[0] and first[1] == second[1]


class PolledEvent(SimEvent):
    """A pollable event (as a GPU's is) completed by the test: after ``after`` queries, or by
    :meth:`complete` from any thread; ``fail`` makes its next query raise."""

    pollable = True

    def __init__(self, after: int | None = None) -> None:
        super().__init__()
        self.after, self.queries, self.fail = after, 0, False

    def query(self) -> bool:
        self.queries += 1
        if self.fail:
            raise BackendError("the device failed")
        if self.after is not None and self.queries > self.after and not super().query():
            self.complete()
        return super().query()


@pytest.mark.anyio
async def test_a_pollable_event_is_polled_until_it_completes() -> None:
    event = PolledEvent(after=5)
    with anyio.fail_after(HANG_GUARD):
        await running_loop().wait(event, spin=HANG_GUARD)
    assert event.query() and event.queries > 5  # reached by polling, not by a callback


@pytest.mark.anyio
async def test_many_tasks_poll_their_events_at_once() -> None:
    events = [PolledEvent(after=i % 7) for i in range(50)]
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await running_loop().wait(events[i], spin=HANG_GUARD)
        woken.append(i)

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(waiter, i)
    assert sorted(woken) == list(range(50))


@pytest.mark.anyio
async def test_a_pollable_event_past_its_spin_is_left_to_its_callback() -> None:
    event = PolledEvent()  # completes only when the test says so
    woken = anyio.Event()

    async def waiter() -> None:
        await running_loop().wait(event, spin=1e-3)
        woken.set()

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0.05)  # well past the spin: polling stopped
            polled = event.queries
            await anyio.sleep(0.02)
            assert event.queries == polled, "polling must stop at the spin's deadline"
            assert not woken.is_set()
            threading.Thread(target=event.complete).start()
    assert woken.is_set()


@pytest.mark.anyio
async def test_a_cancelled_poll_stops_polling() -> None:
    event = PolledEvent()
    with anyio.move_on_after(0.01) as scope:
        await running_loop().wait(event, spin=HANG_GUARD)
    assert scope.cancelled_caught
    await anyio.sleep(0.01)
    polled = event.queries
    await anyio.sleep(0.02)
    assert event.queries == polled, "a cancelled waiter's event must not be polled any more"


@pytest.mark.anyio
async def test_a_failing_query_is_raised_in_the_waiting_task() -> None:
    event = PolledEvent()
    other = PolledEvent(after=20)  # polled alongside: unharmed by the other's failure

    async def fail_soon() -> None:
        await anyio.sleep(0.005)
        event.fail = True

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(fail_soon)
            tg.start_soon(running_loop().wait, other, HANG_GUARD)
            with pytest.raises(BackendError, match="the device failed"):
                await running_loop().wait(event, spin=HANG_GUARD)
    assert other.query()
