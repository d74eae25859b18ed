"""Fault injection: failed allocations, events, copies and prefetches, and context resets.

Every future must end (an ArrayResponse or a clear AiocubieError), a failed batch must free what
it had allocated, invalidate hooks run exactly once per reset, and accounting returns to zero.
"""

from __future__ import annotations

import random
from collections import Counter

import anyio
import numpy as np
import pytest
from _reliability import Component, outcome, pending

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.errors import AiocubieWarning, AllocationError, BackendError, ContextResetError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def three_arrays(runs: int = 100) -> dict[str, ArrayRequest]:
    return {
        "state": ArrayRequest((4, runs), "float32", chunk_axis=1, zero=True),
        "out": ArrayRequest((runs,), "float64"),
        "params": ArrayRequest((8,), "int32", unchunkable=True),
    }


async def ask_all(mgr: MemoryManager, members: list[Component], requests: dict[str, ArrayRequest]) -> list[object]:
    """One request per member, concurrently; their outcomes in member order."""
    results: list[object] = [None] * len(members)

    async def ask(index: int) -> None:
        results[index] = await outcome(mgr, members[index], requests)

    async with anyio.create_task_group() as tg:
        for index in range(len(members)):
            tg.start_soon(ask, index)
    return results


def release_all(mgr: MemoryManager, results: list[object]) -> None:
    for result in results:
        if isinstance(result, ArrayResponse):
            mgr.release(result)


@pytest.mark.parametrize("after", [0, 5, 11])
async def test_allocation_fault_mid_batch_fails_the_whole_batch_and_frees_it(after: int, drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        # a long window: the batch closes when all four members have asked, so it is one batch
        async with MemoryManager(sim, batch_window=30) as mgr:
            members = [Component(i) for i in range(4)]
            for member in members:
                mgr.register(member)
            sim.faults.inject("allocate", after=after)  # 12 allocations in the batch; one fails

            results = await ask_all(mgr, members, three_arrays())

            assert all(isinstance(r, AllocationError) for r in results), results
            assert all("injected fault" in str(r) for r in results)
            assert sim.faults.fired["allocate"] == 1
            await drained(mgr, sim)
            assert mgr.stats().groups["default"].failures == len(members)

            # the group goes on serving: the next batch gets its arrays
            results = await ask_all(mgr, members, three_arrays())
            assert all(isinstance(r, ArrayResponse) for r in results), results
            assert sim.used > 0
            release_all(mgr, results)
            await drained(mgr, sim)


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_allocation_faults_over_many_batches(seed: int, drained) -> None:
    sim = SimulatorBackend(256 * MiB)
    rng = random.Random(seed)
    with anyio.fail_after(20):
        async with MemoryManager(sim, batch_window=30) as mgr:
            members = [Component(i) for i in range(6)]
            for member in members:
                mgr.register(member)
            sim.faults.inject("allocate", probability=0.05, times=None, seed=seed)
            held: list[ArrayResponse] = []
            failed_batches = served = 0
            for _ in range(60):
                results = await ask_all(mgr, members, three_arrays(rng.randint(1, 500)))
                kinds = {type(r) for r in results}
                assert len(kinds) == 1, f"a batch must be served or fail as a whole: {results}"
                if kinds == {AllocationError}:
                    failed_batches += 1
                else:
                    assert kinds == {ArrayResponse}
                    served += 1
                    held.extend(results)  # type: ignore[arg-type]
                # release a random part of what is held, so batches meet a changing device
                rng.shuffle(held)
                while held and rng.random() < 0.6:
                    mgr.release(held.pop())
                assert sim.used == mgr.stats().live_bytes
            assert failed_batches == sim.faults.fired["allocate"] > 0
            assert served > 0
            for response in held:
                mgr.release(response)
            await drained(mgr, sim)


async def test_event_fault_fails_the_batch_and_frees_its_arrays(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=30) as mgr:
            members = [Component(i) for i in range(3)]
            for member in members:
                mgr.register(member)
            sim.faults.inject("record_event", after=1)  # the second batch's event fails
            first = await ask_all(mgr, members, three_arrays())
            second = await ask_all(mgr, members, three_arrays())
            assert all(isinstance(r, ArrayResponse) for r in first)
            assert all(isinstance(r, BackendError) and "recording an event" in str(r) for r in second)
            assert (
                sim.used
                == mgr.stats().live_bytes
                == sum(
                    a.nbytes
                    for r in first
                    for a in r.arrays.values()  # type: ignore[attr-defined]
                )
            )
            release_all(mgr, first)
            await drained(mgr, sim)


async def test_copy_and_prefetch_faults_raise_backend_errors_and_recover(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim) as mgr:
            solver = Component()
            mgr.register(solver)
            requests = {
                "a": ArrayRequest((256,), "float64"),
                "b": ArrayRequest((256,), "float64"),
                "m": ArrayRequest((256,), "float64", kind="managed"),
            }
            async with mgr.request(solver, requests) as response:
                hosts = [np.arange(256, dtype=np.float64) * k for k in (1, 2)]
                devices = [response.arrays["a"], response.arrays["b"]]

                sim.faults.inject("copy", after=1)
                with pytest.raises(BackendError, match="copying"):
                    await mgr.host.to_device(solver, hosts, devices)
                await mgr.host.to_device(solver, hosts, devices)  # one failure only: it works again
                back = [mgr.host.array(256, np.float64, "host") for _ in range(2)]
                await mgr.host.from_device(solver, devices, back)
                np.testing.assert_array_equal(back[1], hosts[1])

                sim.faults.inject("prefetch")
                with pytest.raises(BackendError, match="prefetching"):
                    await mgr.host.prefetch(solver, response.arrays["m"])
                await mgr.host.prefetch(solver, response.arrays["m"], device=None)

                sim.faults.inject("record_event")
                with pytest.raises(BackendError, match="recording an event"):
                    await mgr.groups.sync(solver)
                await mgr.groups.sync(solver)
            await drained(mgr, sim)


class Hooked(Component):
    def __init__(self, tag: object = None) -> None:
        super().__init__(tag)
        self.invalidated = 0

    def invalidate(self) -> None:
        self.invalidated += 1


def reset(mgr: MemoryManager, how: str) -> None:
    if how == "invalidate_all":
        mgr.pool.invalidate_all()
    else:
        with pytest.warns(AiocubieWarning, match="resets the device context"):
            mgr.pool.set_allocator(how)


@pytest.mark.parametrize("how", ["invalidate_all", "cupy"])
async def test_reset_while_requests_are_queued_serves_them_afterwards(how: str, drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=30) as mgr:
            members = [Hooked(i) for i in range(3)]
            for member in members:
                mgr.register(member, invalidate_hook=member.invalidate)
            held = await ask_all(mgr, members, three_arrays())  # arrays the reset must drop
            results: list[object] = [None, None]

            async def ask(index: int) -> None:
                results[index] = await outcome(mgr, members[index], three_arrays())

            async with anyio.create_task_group() as tg:
                for index in range(2):  # the third member has not asked: the batch stays open
                    tg.start_soon(ask, index)
                while pending(mgr) < 2:
                    await anyio.sleep(0.001)
                reset(mgr, how)
                assert [m.invalidated for m in members] == [1, 1, 1]
                assert sim.used == mgr.stats().live_bytes == 0
                mgr.groups.flush()

            assert all(isinstance(r, ArrayResponse) for r in results), results
            assert all(r.stream is mgr.groups.stream(members[0]) for r in results)  # type: ignore[attr-defined]
            assert sim.used == mgr.stats().live_bytes > 0
            release_all(mgr, held)  # already dropped by the reset: releasing again is harmless
            release_all(mgr, results)
            assert [m.invalidated for m in members] == [1, 1, 1]
            await drained(mgr, sim)


@pytest.mark.parametrize("how", ["invalidate_all", "cupy_async"])
async def test_reset_while_batches_are_in_flight_fails_them_cleanly(how: str, drained) -> None:
    sim = SimulatorBackend(64 * MiB, latency=0.02)  # the device takes a while on each item
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0) as mgr:
            members = [Hooked(i) for i in range(4)]
            for member in members:
                mgr.register(member, invalidate_hook=member.invalidate)
            results: list[object] = [None] * 4

            async def ask(index: int) -> None:
                results[index] = await outcome(mgr, members[index], three_arrays())

            async with anyio.create_task_group() as tg:
                for index in range(4):
                    tg.start_soon(ask, index)
                # wait until every request has its arrays and waits for the device
                while sum(g.in_flight for g in mgr.statistics().groups.values()) != 4 or pending(mgr) != 4:
                    await anyio.sleep(0.001)
                reset(mgr, how)

            assert all(isinstance(r, ContextResetError) for r in results), results
            cause = "invalidate_all" if how == "invalidate_all" else f"set_allocator({how!r})"
            assert all(cause in str(r) for r in results)
            assert [m.invalidated for m in members] == [1] * 4
            await drained(mgr, sim)
            # the new context serves requests
            again = await ask_all(mgr, members, three_arrays())
            assert all(isinstance(r, ArrayResponse) for r in again), again
            release_all(mgr, again)
            await drained(mgr, sim)


@pytest.mark.parametrize("seed", [3, 4])
async def test_resets_at_random_moments_end_every_request(seed: int, drained) -> None:
    """Resets land while requests are queued, being planned and in flight: each one still ends."""
    sim = SimulatorBackend(64 * MiB, latency=0.001)
    rng = random.Random(seed)
    with anyio.fail_after(30):
        async with MemoryManager(sim, batch_window=0.001) as mgr:
            members = [Hooked(i) for i in range(8)]
            for member in members:
                mgr.register(member, invalidate_hook=member.invalidate)
            ends: Counter[str] = Counter()
            resets = 0

            async def worker(member: Hooked) -> None:
                for _ in range(15):
                    result = await outcome(mgr, member, three_arrays())  # one batch, one run length
                    ends[type(result).__name__] += 1
                    if isinstance(result, ArrayResponse):
                        await anyio.sleep(rng.random() * 0.003)
                        mgr.release(result)
                    else:
                        assert isinstance(result, ContextResetError), result

            async with anyio.create_task_group() as tg:
                for member in members:
                    tg.start_soon(worker, member)
                for _ in range(10):
                    await anyio.sleep(rng.random() * 0.01)
                    how = rng.choice(["invalidate_all", "cupy", "default"])
                    reset(mgr, how)
                    resets += 1

            assert sum(ends.values()) == 8 * 15
            assert ends["ArrayResponse"] > 0
            assert [m.invalidated for m in members] == [resets] * 8
            await drained(mgr, sim)
