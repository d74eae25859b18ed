"""Reclaim that awaits: async reclaim hooks are awaited, with a deadline, before a batch that does not
fit whole waits, chunks or fails; one that raises or times out is logged and skipped; cancellation
while a hook is awaited leaks nothing. Plain hooks keep their place (out of memory).

On asyncio, trio and uvloop.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from _reliability import LOOPS, Component

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

TOTAL = 1_000_000


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def chunkable(nbytes: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((nbytes,), "u1", chunk_axis=0)}


def blob(nbytes: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((nbytes,), "u1", unchunkable=True)}


async def test_an_async_hook_that_frees_lets_the_batch_through_whole(drained) -> None:
    sim = SimulatorBackend(TOTAL)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0, free_cache_seconds=0) as mgr:
            cache, part = Component("cache"), Component("part")
            mgr.register(cache, stream_group="cache")
            mgr.register(part, stream_group="work")
            held = [await mgr.request(cache, blob(300_000)) for _ in range(2)]
            asked: list[int] = []

            async def evict(nbytes: int) -> int:
                asked.append(nbytes)
                await anyio.sleep(0.001)  # it may await: a copy to host, a flush
                response = held.pop()
                mgr.release(response)
                return 300_000

            mgr.pool.add_reclaim_hook(evict)
            async with mgr.request(part, chunkable(600_000)) as response:
                assert response.chunks == 1  # whole, not chunked: the hook made room first
            assert len(asked) == 1 and 0 < asked[0] <= 600_000
            recovery = mgr.stats().recovery
            assert (recovery.hook_calls, recovery.hook_bytes_freed, recovery.hook_timeouts) == (1, 300_000, 0)
            assert recovery.out_of_memory == 0  # nothing ran out: the planner saw it would not fit
            async with mgr.request(part, chunkable(100_000)) as response:  # fits: no hook
                assert response.chunks == 1
            assert len(asked) == 1
            mgr.release(held.pop())
            await drained(mgr, sim)


@pytest.mark.parametrize("policy", ["chunk", "wait"])
async def test_a_hook_past_the_deadline_is_cancelled_and_the_batch_goes_on(policy: str, drained, caplog) -> None:
    sim = SimulatorBackend(TOTAL)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0, free_cache_seconds=0, reclaim_timeout=0.05, policy=policy) as mgr:
            cache, part = Component("cache"), Component("part")
            mgr.register(cache, stream_group="cache")
            mgr.register(part, stream_group="work")
            held = await mgr.request(cache, blob(600_000))
            ends: list[str] = []
            later: list[int] = []

            async def stuck(nbytes: int) -> int:
                try:
                    await anyio.sleep_forever()
                finally:
                    ends.append("cancelled")
                return 0

            async def never(nbytes: int) -> int:  # after the deadline: not called
                later.append(nbytes)
                return 0

            mgr.pool.add_reclaim_hook(stuck)
            mgr.pool.add_reclaim_hook(never)
            with caplog.at_level(logging.WARNING, logger="aiocubie"):
                if policy == "chunk":
                    async with mgr.request(part, chunkable(600_000)) as response:
                        assert response.chunks > 1
                else:
                    with anyio.move_on_after(0.3):  # it waits for memory once the round is over
                        await mgr.request(part, chunkable(600_000))
            assert ends == ["cancelled"] and later == []
            assert mgr.stats().recovery.hook_timeouts == 1
            assert "reclaim_timeout=0.05" in caplog.text
            mgr.release(held)
            await drained(mgr, sim)


async def test_a_hook_that_raises_is_logged_and_the_next_one_is_awaited(drained, caplog) -> None:
    sim = SimulatorBackend(TOTAL)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0, free_cache_seconds=0, policy="fail", mode="active") as mgr:
            cache, part = Component("cache"), Component("part")
            mgr.register(cache, stream_group="work", proportion=0.5)
            mgr.register(part, stream_group="work", proportion=0.4)
            held = await mgr.request(cache, blob(400_000))
            calls: list[str] = []

            async def broken(nbytes: int) -> int:
                calls.append("broken")
                raise RuntimeError("a broken hook")

            async def frees(nbytes: int) -> int:
                calls.append("frees")
                mgr.release(held)
                return 400_000

            mgr.pool.add_reclaim_hook(broken)
            mgr.pool.add_reclaim_hook(frees)
            with caplog.at_level(logging.ERROR, logger="aiocubie"):
                async with mgr.request(part, blob(600_000)) as response:  # policy fail: whole or nothing
                    assert response.chunks == 1
            assert calls == ["broken", "frees"] and "a broken hook" in caplog.text
            assert mgr.stats().recovery.hook_calls == 2
            await drained(mgr, sim)


async def test_cancelled_while_a_hook_is_awaited_leaks_nothing(drained) -> None:
    sim = SimulatorBackend(TOTAL)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0, free_cache_seconds=0, policy="wait") as mgr:
            cache, part = Component("cache"), Component("part")
            mgr.register(cache, stream_group="cache")
            mgr.register(part, stream_group="work")
            held = await mgr.request(cache, blob(700_000))
            entered, go_on = anyio.Event(), anyio.Event()

            async def slow(nbytes: int) -> int:
                entered.set()
                await go_on.wait()
                return 0

            mgr.pool.add_reclaim_hook(slow)
            async with anyio.create_task_group() as tg:

                async def ask() -> None:
                    await mgr.request(part, chunkable(600_000))
                    raise AssertionError("served with no room")

                tg.start_soon(ask)
                await entered.wait()
                tg.cancel_scope.cancel()  # the requester goes while the group's task awaits the hook
            go_on.set()
            await anyio.sleep(0.01)
            assert mgr.statistics().pending == 0
            mgr.release(held)
            async with mgr.request(part, chunkable(600_000)) as response:  # the group goes on serving
                assert response.chunks == 1
            await drained(mgr, sim)


async def test_leaving_the_manager_while_a_hook_is_awaited_cancels_it_and_fails_the_request() -> None:
    sim = SimulatorBackend(TOTAL)
    ends: list[object] = []
    cache, part = Component("cache"), Component("part")
    entered = anyio.Event()

    async def stuck(nbytes: int) -> int:
        entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            ends.append("cancelled")
        return 0

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with MemoryManager(sim, batch_window=0, free_cache_seconds=0, reclaim_timeout=30) as mgr:
                mgr.register(cache, stream_group="cache")
                mgr.register(part, stream_group="work")
                held = await mgr.request(cache, blob(700_000))
                mgr.pool.add_reclaim_hook(stuck)

                async def ask() -> None:
                    try:
                        await mgr.request(part, chunkable(600_000))
                    except Exception as exc:
                        ends.append(type(exc).__name__)

                tg.start_soon(ask)
                await entered.wait()
            del held  # the manager left while the group's task awaited the hook
    assert "cancelled" in ends and "ManagerStateError" in ends
    assert sim.used == 0
