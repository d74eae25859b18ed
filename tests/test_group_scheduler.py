"""Unit tests of GroupScheduler alone: built from its collaborators, no MemoryManager.

A scheduler is handed a group, the members, options, a device account (on the real simulator),
the loop's primitives and a way to start tasks. These tests drive it through ``submit`` and its
``run`` task and check tickets, the account and the counters, on asyncio and trio.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from simkit import HANG_GUARD, Part, hold_stream, vec, wait_until, warns_waits_on_itself

from aiocubie._accounting import DeviceAccount
from aiocubie._completion import Loop
from aiocubie._options import Options
from aiocubie._registry import Registry
from aiocubie._requests import check_requests
from aiocubie._scheduler import GroupScheduler
from aiocubie._stats import Telemetry
from aiocubie._tickets import State, Ticket
from aiocubie._waiting import WaitingLine
from aiocubie.errors import ContextResetError, InsufficientMemoryError, ManagerStateError, UnchunkableTooLargeError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

TOTAL = 1 << 20


class Rig:
    """A scheduler for group "g" and the parts it was built from."""

    def __init__(self, sim: SimulatorBackend, options: Options, tg: anyio.abc.TaskGroup, members: int) -> None:
        self.sim = sim
        self.telemetry = Telemetry()
        self.registry = Registry(sim.device.create_stream, self.telemetry)
        self.account = DeviceAccount(sim, options)
        self.account.listen(lambda: self.scheduler.changed())
        self.group = self.registry.ensure_group("g")
        self.parts = [Part() for _ in range(members)]
        for part in self.parts:
            self.account.budget.add(id(part), None)
            self.registry.add(part, group="g", name=None, invalidate_hook=None, ready_hook=None)
        line = WaitingLine(lambda: self.scheduler.changed())
        self.scheduler = GroupScheduler(self.group, self.registry.members, self.account, Loop(), tg.start_soon, line)
        self.tg = tg

    def ticket(self, part: Part, **arrays: Any) -> Ticket:
        member = self.registry.member(part)
        return Ticket(member.key, check_requests(arrays), (self.group.counters, member.counters))

    def start(self) -> None:
        self.tg.start_soon(self.scheduler.run)

    async def resolved(self, ticket: Ticket) -> None:
        with anyio.fail_after(HANG_GUARD):
            await ticket.wait(Loop().signal)


@pytest.fixture
async def rig_factory() -> AsyncIterator[Any]:
    sims: list[SimulatorBackend] = []
    async with anyio.create_task_group() as tg:

        def make(members: int = 1, total: int = TOTAL, **options: Any) -> Rig:
            sims.append(SimulatorBackend(total))
            return Rig(sims[-1], Options(**options), tg, members)

        yield make
        tg.cancel_scope.cancel()
    for sim in sims:
        sim.close()


async def test_a_request_that_closes_its_batch_is_served_in_the_callers_task(rig_factory: Any) -> None:
    rig = rig_factory(members=1)  # no run() task: only the caller's task can serve it
    ticket = rig.ticket(rig.parts[0], x=vec(100))
    rig.scheduler.submit(ticket)
    assert ticket.state in (State.ALLOCATED, State.READY)
    assert not rig.scheduler.queue
    await rig.resolved(ticket)
    response = ticket.result()
    assert response.arrays["x"].shape == (100,) and response.chunks == 1
    assert rig.account.ledger.live == 800 == rig.sim.used
    assert (rig.group.counters.requests, rig.group.counters.batches) == (0, 1)  # requests: the stream groups count
    rig.account.release(response)
    assert rig.account.ledger.live == 0 == rig.sim.used


async def test_window_zero_serves_inline_even_with_other_members(rig_factory: Any) -> None:
    rig = rig_factory(members=3, batch_window=0)
    ticket = rig.ticket(rig.parts[1], x=vec(10))
    rig.scheduler.submit(ticket)
    assert ticket.state is not State.PENDING and not rig.scheduler.queue


async def test_a_batch_waits_for_every_member_then_gets_one_plan(rig_factory: Any) -> None:
    rig = rig_factory(members=2, batch_window=HANG_GUARD)
    rig.start()
    first = rig.ticket(rig.parts[0], x=vec(1000, chunk_axis=0))
    rig.scheduler.submit(first)
    await anyio.sleep(0.02)
    assert first.pending and list(rig.scheduler.queue) == [first]  # the other member has not asked
    second = rig.ticket(rig.parts[1], y=vec(1000, "float32"))
    rig.scheduler.submit(second)
    await rig.resolved(first)
    await rig.resolved(second)
    a, b = first.result(), second.result()
    assert (a.chunks, a.chunk_length) == (b.chunks, b.chunk_length) == (1, 1000)
    assert rig.group.counters.batches == 1


async def test_a_batch_that_does_not_fit_is_chunked_in_lockstep(rig_factory: Any) -> None:
    rig = rig_factory(members=2, batch_window=HANG_GUARD, headroom=0.0)
    rig.start()
    runs = 100_000  # 12 bytes a run against 1 MiB: must be chunked
    tickets = [rig.ticket(rig.parts[0], a=vec(runs)), rig.ticket(rig.parts[1], b=vec(runs, "float32"))]
    for ticket in tickets:
        rig.scheduler.submit(ticket)
    for ticket in tickets:
        await rig.resolved(ticket)
    chunks = math.ceil(runs / (TOTAL // 12))
    for ticket in tickets:
        response = ticket.result()
        assert (response.chunks, response.chunk_length) == (chunks, math.ceil(runs / chunks))
    assert rig.account.ledger.live <= TOTAL


async def test_a_request_queued_behind_another_is_not_served_inline(rig_factory: Any) -> None:
    rig = rig_factory(members=2, batch_window=HANG_GUARD)
    first = rig.ticket(rig.parts[0], x=vec(10))
    rig.scheduler.submit(first)  # queued: the other member has not asked
    later = rig.ticket(rig.parts[0], x=vec(10))
    rig.scheduler.submit(later)
    assert list(rig.scheduler.queue) == [first, later] and first.pending and later.pending


async def test_planning_errors_fail_the_ticket_and_count_a_failure(rig_factory: Any) -> None:
    rig = rig_factory(members=1)
    ticket = rig.ticket(rig.parts[0], p=vec(TOTAL, unchunkable=True))  # 8 MiB on a 1 MiB device
    rig.scheduler.submit(ticket)
    assert ticket.state is State.FAILED
    with pytest.raises(UnchunkableTooLargeError, match="unchunkable"):
        ticket.result()
    assert rig.group.counters.failures == 1 and rig.account.ledger.live == 0


async def test_policy_fail_refuses_a_batch_that_does_not_fit_whole(rig_factory: Any) -> None:
    rig = rig_factory(members=1, mode="active", policy="fail")
    ticket = rig.ticket(rig.parts[0], x=vec(TOTAL // 8))  # the whole device: over the cap with headroom
    rig.scheduler.submit(ticket)
    with pytest.raises(InsufficientMemoryError, match="policy 'fail'"):
        ticket.result()


async def test_policy_wait_queues_until_memory_is_released(rig_factory: Any) -> None:
    rig = rig_factory(members=1, mode="active", policy="wait", headroom=0.0)
    rig.start()
    holder = rig.ticket(rig.parts[0], x=vec(TOTAL // 16))  # half the device
    rig.scheduler.submit(holder)
    await rig.resolved(holder)
    waiter = rig.ticket(rig.parts[0], x=vec(TOTAL // 16 + 1000))  # fits only once the holder goes
    with warns_waits_on_itself():  # the holder is the same member
        rig.scheduler.submit(waiter)
        assert waiter.pending and waiter.leftover  # handed to the group's task to wait
        await anyio.sleep(0.02)
    assert waiter.pending
    rig.account.release(holder.result())  # the account tells the scheduler (its listener)
    await rig.resolved(waiter)
    assert waiter.result().chunks == 1


async def test_batches_resolve_in_stream_order_and_call_the_ready_hook(rig_factory: Any) -> None:
    rig = rig_factory(members=0)
    seen: list[object] = []
    part = Part()
    rig.account.budget.add(id(part), None)
    rig.registry.add(part, group="g", name=None, invalidate_hook=None, ready_hook=seen.append)
    assert rig.group.hooks == 1
    gate = hold_stream(rig.group.stream)
    tickets = [rig.ticket(part, x=vec(10)) for _ in range(3)]
    for ticket in tickets:
        rig.scheduler.submit(ticket)
        assert ticket.state is State.ALLOCATED  # served inline, but the device is held
    await anyio.sleep(0.02)
    assert seen == []
    gate.set()
    for ticket in tickets:
        await rig.resolved(ticket)
    assert seen == [ticket.result() for ticket in tickets]


async def test_cancelled_in_flight_ticket_is_released_when_the_device_is_done(rig_factory: Any) -> None:
    rig = rig_factory(members=1)
    gate = hold_stream(rig.group.stream)
    ticket = rig.ticket(rig.parts[0], x=vec(100))
    rig.scheduler.submit(ticket)
    assert ticket.cancel() is None  # its arrays are in flight: released later, not now
    assert rig.sim.used == 800
    gate.set()
    await wait_until(lambda: rig.sim.used == 0)
    assert rig.account.ledger.live == 0 and rig.group.counters.cancellations == 1


async def test_reset_fails_in_flight_tickets_and_close_fails_the_rest(rig_factory: Any) -> None:
    rig = rig_factory(members=2, batch_window=HANG_GUARD)
    gate = hold_stream(rig.group.stream)
    rig.account.configure(batch_window=0)
    rig.scheduler.changed()
    flying = rig.ticket(rig.parts[0], x=vec(100))
    rig.scheduler.submit(flying)
    assert flying.state is State.ALLOCATED
    rig.scheduler.reset(ContextResetError("reset"))
    with pytest.raises(ContextResetError):
        flying.result()
    rig.account.configure(batch_window=HANG_GUARD)
    rig.scheduler.changed()
    queued = rig.ticket(rig.parts[0], x=vec(100))
    rig.scheduler.submit(queued)
    assert queued.pending
    held = rig.scheduler.close(ManagerStateError("closed"))
    assert held == []  # a queued ticket holds no arrays
    with pytest.raises(ManagerStateError):
        queued.result()
    gate.set()
    later = rig.ticket(rig.parts[1], x=vec(10))
    rig.scheduler.submit(later)  # a closed scheduler serves nothing inline
    assert later.pending


async def test_drop_ends_a_members_tickets_and_returns_what_it_held(rig_factory: Any) -> None:
    rig = rig_factory(members=1)
    gate = hold_stream(rig.group.stream)
    ticket = rig.ticket(rig.parts[0], x=vec(100))
    rig.scheduler.submit(ticket)
    held = rig.scheduler.drop(rig.registry.member(rig.parts[0]).key, ManagerStateError("gone"))
    assert held and held[0].arrays["x"].shape == (100,)
    for response in held:
        rig.account.release(response)
    assert rig.sim.used == 0
    gate.set()
    with pytest.raises(ManagerStateError, match="gone"):
        ticket.result()
