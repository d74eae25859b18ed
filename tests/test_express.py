"""The express path (``GroupScheduler.express``): a request of a group's only member, with nothing queued,
planned or in flight and the last plan applying, is allocated in the awaiting task with no ticket.

Every test checks that the path was taken (``stats().groups[...].express``, which counts only the requests it
handled), so none can pass by falling back to the ordinary way; the outcomes are the ordinary way's:
cancellation between request and ready, a fault in the allocation, a reset, a release from another task,
hooks, history and counters. On the zero-latency device (``InstantBackend``: events done when recorded) the
request is served with no ticket at all; on the simulator its event is not reached yet, so it waits in flight.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
from simkit import LOOPS, Part, assert_all_released, hold_stream, wait_until

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie._bench import InstantBackend
from aiocubie._scheduler import GroupScheduler
from aiocubie.errors import AllocationError, ContextResetError, RegistrationError, ReleasedError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20
REQUEST = {"a": ArrayRequest((256,), np.float32)}  # 1 KiB


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def backend(kind: str) -> Any:
    return InstantBackend(64 * MiB) if kind == "instant" else SimulatorBackend(64 * MiB)


def express(mgr: MemoryManager, group: str = "solo") -> int:
    return mgr.stats().groups[group].express


async def warm(mgr: MemoryManager, part: Part) -> None:
    """One request the ordinary way: it leaves the plan the express path reuses."""
    mgr.release(await mgr.request(part, REQUEST))


async def settled(mgr: MemoryManager) -> None:
    """Wait until nothing is held (a cancelled request in flight is freed when its event is reached)."""
    with anyio.fail_after(5):
        await wait_until(lambda: mgr.stats().live_bytes == 0 and not mgr.statistics().groups["solo"].pending)


@pytest.mark.parametrize("kind", ["instant", "simulator"])
async def test_requests_in_a_loop_go_express_and_are_counted_as_the_ordinary_way_counts(kind: str) -> None:
    counts = {}
    for lone in (True, False):
        async with MemoryManager(backend(kind), batch_window=0) as mgr:
            part, idle = Part(), Part()
            mgr.register(part, stream_group="solo")
            if not lone:  # a second member that never asks: every request goes the ordinary way
                mgr.register(idle, stream_group="solo")
            for _ in range(10):
                response = await mgr.request(part, REQUEST)
                assert response.arrays["a"].shape == (256,) and response.chunks == 1
                mgr.release(response)
            usage = mgr.stats().groups["solo"]
            counts[lone] = (usage.express, usage.requests, usage.batches, usage.chunks, usage.failures)
            counts[lone] += (usage.cancellations, usage.queue_wait.count, usage.ready_latency.count)
            assert mgr.stats().live_bytes == 0
    assert counts[True] == (9, 10, 10, 10, 0, 0, 10, 10)  # the first request leaves the plan the others reuse
    assert counts[False] == (0, *counts[True][1:])


@pytest.mark.parametrize("kind", ["instant", "simulator"])
async def test_a_request_cancelled_between_request_and_ready_on_the_express_path_frees_its_arrays(kind: str) -> None:
    async with MemoryManager(backend(kind)) as mgr:
        part = Part()
        mgr.register(part, stream_group="solo")
        await warm(mgr, part)
        with anyio.CancelScope() as scope:
            scope.cancel()  # delivered at the request's checkpoint, once its arrays are allocated
            await mgr.request(part, REQUEST)
        assert scope.cancelled_caught
        usage = mgr.stats().groups["solo"]
        assert (usage.express, usage.requests, usage.cancellations) == (1, 2, 1)
        await settled(mgr)
        response = await mgr.request(part, REQUEST)  # the group goes on, express
        assert express(mgr) == 2
        mgr.release(response)


async def test_a_fault_injected_in_an_express_allocation_fails_that_request_alone() -> None:
    sim = SimulatorBackend(64 * MiB)
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, stream_group="solo")
        await warm(mgr, part)
        sim.faults.inject("allocate")
        with pytest.raises(AllocationError, match="injected fault"):
            await mgr.request(part, REQUEST)
        usage = mgr.stats().groups["solo"]
        assert (usage.express, usage.requests, usage.failures, usage.batches) == (1, 2, 1, 1)
        assert sim.faults.fired["allocate"] == 1
        await settled(mgr)
        sim.faults.inject("oom")  # absorbed: the account frees the pool's cache and tries again
        response = await mgr.request(part, REQUEST)
        assert express(mgr) == 2 and mgr.stats().recovery.recovered == 1
        mgr.release(response)
        await settled(mgr)
        assert_all_released(mgr, sim)


@pytest.mark.parametrize("kind", ["instant", "simulator"])
async def test_a_reset_releases_an_express_response(kind: str) -> None:
    async with MemoryManager(backend(kind)) as mgr:
        part = Part()
        mgr.register(part, stream_group="solo")
        await warm(mgr, part)
        response = await mgr.request(part, REQUEST)
        assert express(mgr) == 1
        mgr.pool.invalidate_all()
        assert response.released == {"a"}
        with pytest.raises(ReleasedError):
            response.arrays["a"].fill(0)
        await settled(mgr)
        for _ in range(3):  # the reset re-reads the device: the first plan is made anew, the next go express
            mgr.release(await mgr.request(part, REQUEST))
        assert express(mgr) >= 3


async def test_a_reset_while_an_express_request_is_in_flight_fails_it() -> None:
    sim = SimulatorBackend(64 * MiB)
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, stream_group="solo")
        await warm(mgr, part)
        errors: list[BaseException] = []

        async def in_flight() -> None:
            with pytest.raises(ContextResetError) as caught:
                await mgr.request(part, REQUEST)
            errors.append(caught.value)

        gate = hold_stream(mgr.groups.stream(part))
        try:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(in_flight)
                    await wait_until(lambda: mgr.statistics().groups["solo"].in_flight == 1)
                    mgr.pool.invalidate_all()
        finally:
            gate.set()
        assert len(errors) == 1 and express(mgr) == 1
        await settled(mgr)
        assert_all_released(mgr, sim)


@pytest.mark.parametrize("kind", ["instant", "simulator"])
async def test_an_express_response_released_from_another_task(kind: str) -> None:
    async with MemoryManager(backend(kind)) as mgr:
        part = Part()
        mgr.register(part, stream_group="solo")
        await warm(mgr, part)
        response = await mgr.request(part, REQUEST)
        assert express(mgr) == 1 and mgr.stats().live_bytes == 1024
        async with anyio.create_task_group() as tg:
            tg.start_soon(response.aclose)
        assert response.released == {"a"} and mgr.stats().live_bytes == 0
        mgr.release(response)  # twice is a no-op
        async with mgr.request(part, REQUEST) as again:
            assert again.arrays["a"].shape == (256,)
        assert express(mgr) == 2
        await settled(mgr)


@pytest.mark.parametrize("kind", ["instant", "simulator"])
async def test_ready_hooks_ordered_requests_and_history_on_the_express_path(kind: str) -> None:
    async with MemoryManager(backend(kind)) as mgr:
        mgr.record_history()
        part, seen = Part(), []
        mgr.register(part, stream_group="solo", ready_hook=seen.append)
        await warm(mgr, part)
        for ordered in (False, True):
            response = await mgr.request(part, REQUEST, ordered=ordered)
            with anyio.fail_after(5):
                await wait_until(lambda: response in seen)
            mgr.release(response)
        assert express(mgr) == 2 and len(seen) == 3
        kinds = [event.kind.value for event in mgr.history().events]
        assert kinds.count("plan") == 3 and kinds.count("allocate") == 3 and kinds.count("release") == 3
        await settled(mgr)


async def test_a_reclaim_hook_that_unregisters_the_member_during_an_express_allocation() -> None:
    sim = SimulatorBackend(64 * MiB)
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, stream_group="solo")
        await warm(mgr, part)

        def reclaim(nbytes: int) -> int:
            mgr.unregister(part)
            return 0

        mgr.pool.add_reclaim_hook(reclaim)
        sim.faults.inject("oom", times=2)  # the try after the pool's cache fails too: the hook runs
        with pytest.raises(RegistrationError, match="unregistered before its request was served"):
            await mgr.request(part, REQUEST)
        assert express(mgr) == 1 and mgr.stats().live_bytes == 0
        assert_all_released(mgr, sim)


async def test_what_the_last_plan_does_not_cover_goes_the_ordinary_way() -> None:
    async with MemoryManager(InstantBackend(64 * MiB)) as mgr:
        part = Part()
        mgr.register(part, stream_group="solo")
        await warm(mgr, part)
        bigger = {"a": ArrayRequest((512,), np.float32)}
        response = await mgr.request(part, bigger)  # another request set: planned anew
        assert isinstance(response, ArrayResponse) and express(mgr) == 0
        held = await mgr.request(part, REQUEST)  # what is held changed: planned anew
        assert express(mgr) == 0
        mgr.release(response)
        mgr.release(held)
        mgr.release(await mgr.request(part, REQUEST))  # the plan memo holds the last plan: planned anew
        mgr.release(await mgr.request(part, REQUEST))
        assert express(mgr) == 1


@pytest.mark.parametrize("group", ["solo", "elsewhere"])
@pytest.mark.parametrize("express_on", [True, False], ids=["express", "ordinary"])
async def test_a_reclaim_hook_that_registers_the_member_anew_during_its_allocation(
    group: str, express_on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unregistered and registered again by a reclaim hook (the same instance, so the same key, a new
    member), the member's request was of the member that left: it fails as the ordinary way fails it,
    never served as the new member's (nor a KeyError for a group that went with the old member)."""
    if not express_on:
        monkeypatch.setattr(GroupScheduler, "express", lambda self, member, requests, ordered: None)
    sim = SimulatorBackend(64 * MiB)
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, stream_group="solo")
        await warm(mgr, part)

        def reclaim(nbytes: int) -> int:
            mgr.unregister(part)
            mgr.register(part, stream_group=group)
            return 0

        mgr.pool.add_reclaim_hook(reclaim)
        sim.faults.inject("oom", times=2)  # the try after the pool's cache fails too: the hook runs
        with pytest.raises(RegistrationError, match="unregistered before its request was served"):
            await mgr.request(part, REQUEST)
        assert mgr.stats().live_bytes == 0 and mgr.is_registered(part)
        mgr.release(await mgr.request(part, REQUEST))  # the new member is served
        assert_all_released(mgr, sim)
