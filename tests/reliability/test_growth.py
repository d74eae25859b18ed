"""Bounded resources (issue 11, item 13): thousands of short-lived groups and members.

An empty stream group releases its stream (and the simulator its thread) and its scheduler
task; departed instances' and groups' stats are kept for the most recent ones only; the
ledger forgets departed keys and groups. Nothing grows with the number of registrations.
"""

from __future__ import annotations

import gc
import random
import tracemalloc
from typing import Any

import anyio
import pytest
from _reliability import LOOPS, SEEDS, Component, outcome, scale, sim_stream_threads

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie._stats import DEPARTED
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def block() -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((4, 1024), "float32", chunk_axis=1)}


def sizes(mgr: MemoryManager) -> dict[str, int]:
    """Every per-group and per-instance structure of the manager, by size."""
    return {**mgr.statistics().tables, "stats instances": len(mgr.stats().instances)}


async def wait_threads(limit: int) -> None:
    with anyio.fail_after(10):
        while True:
            gc.collect()
            if sim_stream_threads() <= limit:
                return
            await anyio.sleep(0.005)


async def wait_tasks(limit: int) -> None:
    """Wait until at most ``limit`` tasks run (a stopped task ends at its next checkpoint)."""
    with anyio.fail_after(10):
        while len(anyio.get_running_tasks()) > limit:
            await anyio.sleep(0.005)


async def test_thousand_short_lived_groups_release_streams_tasks_and_stats(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    threads = sim_stream_threads()
    with anyio.fail_after(scale(60, 600)):
        async with MemoryManager(sim, batch_window=0) as mgr:
            keeper = Component("keeper")
            mgr.register(keeper)
            tasks = len(anyio.get_running_tasks())
            for i in range(scale(1000, 10_000)):
                part = Component(i)
                mgr.register(part, stream_group=f"short-{i}")
                async with mgr.request(part, block()):
                    pass
                if i % 2:
                    mgr.unregister(part)
                del part  # collected: reaped on the loop thread
                if i % 100 == 0:
                    await anyio.sleep(0)
            gc.collect()
            await anyio.sleep(0.01)
            found = sizes(mgr)
            assert found["groups"] == found["schedulers"] == found["members"] == 1, found
            assert found["group counters"] <= DEPARTED + 1 and found["instance counters"] <= DEPARTED + 1, found
            assert found["ledger keys"] <= 2 and found["ledger groups"] <= 2 * (DEPARTED + 1), found
            await wait_tasks(tasks)  # no scheduler task left behind
            await wait_threads(threads + 1)  # the keeper's group's stream only
            mgr.unregister(keeper)
            await drained(mgr, sim)
    sim.close()


async def test_growth_is_bounded_under_churn() -> None:
    """Host memory stays flat once the departed stats are full (traced with tracemalloc)."""
    sim = SimulatorBackend(64 * MiB)
    rounds = scale(300, 6000)
    async with MemoryManager(sim, batch_window=0) as mgr:

        async def churn(n: int) -> None:
            for i in range(n):
                part = Component(i)
                mgr.register(part, stream_group=f"g{i % 7}-{i}")
                await mgr.request(part, block())  # dropped, held: freed when it is collected
                del part

        tracemalloc.start()  # before the warm-up: what it allocates and later frees is traced
        try:
            await churn(2 * DEPARTED)  # fill the departed stats and warm every cache
            gc.collect()
            await anyio.sleep(0.01)
            start = tracemalloc.take_snapshot()
            await churn(rounds)
            gc.collect()
            await anyio.sleep(0.01)
            growth = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(start, "filename"))
        finally:
            tracemalloc.stop()
        assert growth < 512 * 1024, f"{growth} bytes more after {rounds} members and groups"
        assert sim.used == 0
    sim.close()


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_churn_of_groups_and_members(seed: int, drained) -> None:
    """Members join, move, request and leave (unregistered or collected) across many groups."""
    rng = random.Random(seed)
    sim = SimulatorBackend(64 * MiB, latency=rng.choice([0.0, 0.0003]))
    threads = sim_stream_threads()
    with anyio.fail_after(scale(60, 900)):
        async with MemoryManager(sim, batch_window=rng.choice([0, 0.001])) as mgr:
            tasks = len(anyio.get_running_tasks())
            live: list[Component] = []
            held: list[ArrayResponse] = []
            for step in range(scale(800, 20_000)):
                op = rng.random()
                if op < 0.3 or not live:
                    part = Component(step)
                    mgr.register(part, stream_group=f"g{rng.randrange(scale(50, 500))}")
                    live.append(part)
                elif op < 0.45:
                    mgr.groups.move(rng.choice(live), f"g{rng.randrange(scale(50, 500))}")
                elif op < 0.7:
                    result = await outcome(mgr, rng.choice(live), block())
                    if isinstance(result, ArrayResponse) and rng.random() < 0.5:
                        held.append(result)
                elif op < 0.8 and held:
                    mgr.release(held.pop(rng.randrange(len(held))))
                elif op < 0.9:
                    mgr.unregister(live.pop(rng.randrange(len(live))))
                else:
                    live.pop(rng.randrange(len(live)))  # collected
                if len(live) > 20:
                    mgr.unregister(live.pop(0))
            while held:  # and no variable left holding a response: it holds its stream
                mgr.release(held.pop())
            result = None
            for part in live:
                mgr.unregister(part)
            live.clear()
            gc.collect()
            await anyio.sleep(0.01)
            found = sizes(mgr)
            assert found["groups"] == found["schedulers"] == found["members"] == 0, found
            assert found["instance counters"] <= DEPARTED and found["group counters"] <= DEPARTED, found
            await wait_tasks(tasks)  # the scheduler tasks of emptied groups ended
            await wait_threads(threads)
            await drained(mgr, sim)
    sim.close()
