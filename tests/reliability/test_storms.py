"""Cancellation storms: requests cancelled and timed out at every stage leak nothing.

Stages: queued (the batch is still open), waiting for memory (active mode, policy "wait"), and
in flight (allocated, the device not done yet). Afterwards no byte is live, no scheduler holds
a ticket, and no task runs but the schedulers.
"""

from __future__ import annotations

import random
from collections import Counter

import anyio
import pytest
from _reliability import SOAK, Component, pending, settle

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.errors import AiocubieError
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import GroupStatistics

pytestmark = pytest.mark.anyio

MiB = 1 << 20
RUNS = 1024  # one run length for every request: requests of a group share batches


def block(rows: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((rows, RUNS), "float32", chunk_axis=1)}


def stages(mgr: MemoryManager) -> set[str]:
    """The stages the schedulers' requests are at now."""
    found = set()
    for group in mgr.statistics().groups.values():
        for stage, count in [
            ("queued", group.queued),
            ("planning or waiting", group.planning),
            ("in flight", group.in_flight),
            ("ending", group.ending),
        ]:
            if count:
                found.add(stage)
    return found


async def wait_for(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition`` until it holds (the caller's fail_after bounds it)."""
    while not condition():
        await anyio.sleep(0.001)


async def no_extra_tasks(baseline: int) -> None:
    """Wait until only the tasks running at ``baseline`` (the schedulers, the test) are left."""
    while len(anyio.get_running_tasks()) > baseline:
        await anyio.sleep(0.002)


async def test_cancel_while_queued_withdraws_the_ticket(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=30) as mgr:
            a, b = Component("a"), Component("b")
            mgr.register(a)
            mgr.register(b)  # b never asks, so a's request stays queued
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def ask() -> None:
                    with scope:
                        await mgr.request(a, block(4))
                        pytest.fail("a cancelled request must not resolve")

                tg.start_soon(ask)
                await wait_for(lambda: mgr.statistics().groups["default"].queued == 1, "queued")
                scope.cancel()
            assert pending(mgr) == 0
            assert mgr.stats().groups["default"].cancellations == 1
            await drained(mgr, sim)


async def test_cancel_while_waiting_for_memory_lets_the_next_batch_go(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, mode="active", policy="wait", batch_window=0, headroom=0) as mgr:
            holder, waiter, later = Component("holder"), Component("waiter"), Component("later")
            for member in (holder, waiter, later):
                mgr.register(member, proportion=0.1)  # group cap 3 x 6.4 MiB
            cap = 3 * mgr.budget.cap(holder)
            held = await mgr.request(holder, block(cap // (4 * RUNS) - 256))  # all but 1 MiB of the cap
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def ask_big() -> None:
                    with scope:
                        await mgr.request(waiter, block(512))  # 2 MiB: must wait for the holder
                        pytest.fail("a cancelled request must not resolve")

                tg.start_soon(ask_big)
                await wait_for(lambda: mgr.statistics().groups["default"].planning == 1, "waiting for memory")
                scope.cancel()
            # the withdrawn batch no longer blocks the group
            async with mgr.request(later, block(64)) as response:
                assert response.chunks == 1
            assert mgr.stats().groups["default"].cancellations == 1
            mgr.release(held)
            await drained(mgr, sim)


async def test_cancel_while_in_flight_frees_the_arrays_when_the_device_is_done(drained) -> None:
    sim = SimulatorBackend(64 * MiB, latency=0.05)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0) as mgr:
            solver = Component()
            mgr.register(solver)
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def ask() -> None:
                    with scope:
                        await mgr.request(solver, {**block(8), "z": ArrayRequest((RUNS,), "int8", zero=True)})
                        pytest.fail("a cancelled request must not resolve")

                tg.start_soon(ask)
                await wait_for(lambda: mgr.statistics().groups["default"] == GroupStatistics(in_flight=1), "in flight")
                assert sim.used > 0
                scope.cancel()
            await drained(mgr, sim)  # the arrays go once the device reaches the event
            assert mgr.stats().groups["default"].cancellations == 1


@pytest.mark.parametrize("seed", [11, 12])
async def test_cancellation_storm(seed: int, drained) -> None:
    """Hundreds of tasks, thousands of requests, cancelled and timed out at random moments."""
    tasks, per_task = (1000, 40) if SOAK else (300, 10)
    rng = random.Random(seed)
    sim = SimulatorBackend(64 * MiB, latency=0.0002)
    with anyio.fail_after(600 if SOAK else 60):
        async with MemoryManager(sim, mode="active", policy="wait", batch_window=0.001) as mgr:
            groups = ["solve", "load", "infer", "post"]
            members = [Component((g, i)) for g in groups for i in range(4)]
            for member in members:
                mgr.register(member, proportion=0.05, stream_group=member.tag[0])
            baseline = len(anyio.get_running_tasks())
            scopes: set[anyio.CancelScope] = set()
            seen_at_cancel: Counter[str] = Counter()
            ends: Counter[str] = Counter()
            errors: list[AiocubieError] = []
            workers_left = tasks

            async def one(member: Component) -> None:
                kind = rng.random()
                scope = anyio.move_on_after(rng.uniform(0, 0.01)) if kind < 0.35 else anyio.CancelScope()
                if kind >= 0.35:
                    scopes.add(scope)
                try:
                    with scope:
                        async with mgr.request(member, block(rng.randint(1, 256))) as response:
                            assert response.arrays["x"].shape[0] >= 1
                            await anyio.sleep(rng.uniform(0, 0.002))  # hold the arrays a moment
                        ends["served"] += 1
                        return
                    ends["timed out" if kind < 0.35 else "cancelled"] += 1
                finally:
                    scopes.discard(scope)

            async def worker(index: int) -> None:
                nonlocal workers_left
                member = members[index % len(members)]
                try:
                    for _ in range(per_task):
                        try:
                            await one(member)
                        except AiocubieError as exc:
                            errors.append(exc)
                finally:
                    workers_left -= 1

            async def canceller() -> None:
                while workers_left:
                    await anyio.sleep(rng.uniform(0, 0.002))
                    seen_at_cancel.update(stages(mgr))
                    for scope in rng.sample(sorted(scopes, key=id), k=min(len(scopes), rng.randint(0, 8))):
                        scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(canceller)
                for index in range(tasks):
                    tg.start_soon(worker, index)

            assert errors == []
            assert sum(ends.values()) == tasks * per_task
            assert ends["served"] > 0 and ends["cancelled"] + ends["timed out"] > 0
            # the storm reached every stage: queued, being planned or waiting, in flight
            assert {"queued", "planning or waiting", "in flight"} <= set(seen_at_cancel), seen_at_cancel
            snap = mgr.stats()
            assert sum(s.cancellations for s in snap.groups.values()) > 0
            await settle(mgr)
            assert pending(mgr) == 0
            await no_extra_tasks(baseline)
            await drained(mgr, sim)
            for group in groups:
                assert snap.groups[group].peak_bytes <= 4 * mgr.budget.cap(members[0])
