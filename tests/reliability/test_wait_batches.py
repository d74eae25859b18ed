"""Batches that cannot be planned whole: they shrink to what fits, and a request fails alone.

Issue 22 (round two) item 2 and the wait policy's self-deadlock, on asyncio, trio and uvloop.
"""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import pytest
from _reliability import LOOPS, Component, outcome

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.errors import AiocubieWarning
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def unchunkable(nbytes: float) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((int(nbytes) // 4,), "float32", unchunkable=True)}


def waiting(mgr: MemoryManager) -> int:
    """Tickets queued, being planned or waiting for memory."""
    return sum(g.queued + g.planning for g in mgr.statistics().groups.values())


@pytest.mark.parametrize("policy", ["wait", "chunk"])
async def test_a_batch_that_fits_only_in_part_shrinks_and_each_request_is_served(policy: str, drained) -> None:
    # the reproduction: a holder keeps 55% of a 64 MiB device (proportion 0.6); four members of
    # its group (0.05 each) each ask for 30% unchunkable; two fit at once, not four
    total = 64 * MiB
    sim = SimulatorBackend(total)
    with anyio.fail_after(10):
        async with MemoryManager(sim, mode="active", policy=policy) as mgr:
            holder = Component("holder")
            mgr.register(holder, proportion=0.6, stream_group="g")
            askers = [Component(i) for i in range(4)]
            for asker in askers:
                mgr.register(asker, proportion=0.05, stream_group="g")
            held = mgr.allocate(holder, unchunkable(0.55 * total))
            if policy == "chunk":  # it does not wait: room for two of the four from the start
                mgr.release(held)
            results: list[object] = []

            async def ask(asker: Component) -> None:
                result = await outcome(mgr, asker, unchunkable(0.3 * total))
                results.append(result)
                if isinstance(result, ArrayResponse):
                    await anyio.sleep(0.01)
                    mgr.release(result)

            async with anyio.create_task_group() as tg:
                for asker in askers:
                    tg.start_soon(ask, asker)
                if policy == "wait":
                    while waiting(mgr) < 4:
                        await anyio.sleep(0.001)
                    await anyio.sleep(0.02)
                    assert results == []  # waiting, not failed
                    mgr.release(held)
            if policy == "wait":  # nothing starves: every one is served in the end
                assert all(isinstance(r, ArrayResponse) for r in results), results
            else:  # chunk: served while it fits, and a request that does not fails alone
                assert sum(isinstance(r, ArrayResponse) for r in results) >= 2, results
            assert len(results) == 4
            await drained(mgr, sim)


async def test_a_nested_request_over_the_cap_under_wait_says_it_waits_on_itself(drained) -> None:
    # a new user's program: the task holds memory and nests a second request that only fits
    # once the first is released: under "wait" it waited forever, silently
    sim = SimulatorBackend(4 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, mode="active", policy="wait", batch_window=0) as mgr:
            loader = Component("loader")
            mgr.register(loader, proportion=0.5)  # a cap of 2 MiB
            async with mgr.request(loader, unchunkable(1.5 * MiB)):
                with pytest.warns(
                    AiocubieWarning,
                    match=r"of Component#\d+ waits for memory its own requester\(s\) hold \(1.5 MiB\).*forever",
                ):
                    with anyio.move_on_after(0.2) as scope:
                        await mgr.request(loader, unchunkable(1 * MiB))
                assert scope.cancelled_caught  # it does wait (nothing else will release): the warning says why
            await drained(mgr, sim)


async def test_a_request_waiting_on_another_members_memory_is_not_warned_about(drained) -> None:
    sim = SimulatorBackend(4 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, mode="active", policy="wait", batch_window=0) as mgr:
            holder, asker = Component("holder"), Component("asker")
            mgr.register(holder, proportion=0.5)
            mgr.register(asker, proportion=0.25)  # the group: 3 MiB
            held = mgr.allocate(holder, unchunkable(2 * MiB))
            result: list[object] = []

            async def ask() -> None:
                result.append(await outcome(mgr, asker, unchunkable(1.5 * MiB)))

            with warnings.catch_warnings():
                warnings.simplefilter("error", AiocubieWarning)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ask)
                    await anyio.sleep(0.1)
                    assert result == []
                    mgr.release(held)
            assert isinstance(result[0], ArrayResponse), result
            mgr.release(result[0])
            await drained(mgr, sim)


async def test_a_long_batch_shrinks_to_its_longest_head_that_fits(drained) -> None:
    # ten unchunkable tenths of the device: nine fit under the headroom, ten do not
    total = 64 * MiB
    sim = SimulatorBackend(total)
    with anyio.fail_after(10):
        async with MemoryManager(sim, mode="active", policy="wait") as mgr:
            askers = [Component(i) for i in range(10)]
            for asker in askers:
                mgr.register(asker, stream_group="g")  # the auto pool: the group's cap is the device
            served: list[int] = []

            async def ask(asker: Component) -> None:
                result = await outcome(mgr, asker, unchunkable(0.1 * total))
                assert isinstance(result, ArrayResponse), result
                served.append(mgr.stats().groups["g"].batches)
                await anyio.sleep(0.02)
                mgr.release(result)

            async with anyio.create_task_group() as tg:
                for asker in askers:
                    tg.start_soon(ask, asker)
            assert sorted(served) == [1] * 9 + [2]  # nine in the first batch, the last one next
            await drained(mgr, sim)
