"""Lifecycle (issue 11, items 8 to 12): exit by any path releases everything.

Leaving ``async with`` through a cancellation, ``aclose()`` from another task, use after
``close()``, requests from another thread's event loop, and the backend a manager made.
"""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import anyio
import pytest
import trio
from _reliability import LOOPS, SEEDS, Component, MiB, block, outcome, scale, sim_stream_threads

from aiocubie import ArrayResponse, MemoryManager
from aiocubie.errors import AiocubieError, ManagerStateError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def assert_released(mgr: MemoryManager, sim: SimulatorBackend) -> None:
    assert sim.used == 0, f"{sim.used} bytes still on the device"
    assert mgr.statistics().allocations == 0 and mgr.stats().live_bytes == 0
    assert not mgr.running


def queued(mgr: MemoryManager) -> int:
    return sum(g.queued + g.planning for g in mgr.statistics().groups.values())


# -- item 8: leaving `async with` through a cancellation ---------------------------------------
async def test_leaving_async_with_through_cancellation_releases_everything() -> None:
    sim = SimulatorBackend(64 * MiB)
    slow_hook_done = anyio.Event()

    async def slow_hook(response: ArrayResponse) -> None:
        try:
            await anyio.sleep(30)
        finally:
            slow_hook_done.set()

    with anyio.fail_after(10):
        with anyio.move_on_after(0.1) as scope:
            async with MemoryManager(sim, batch_window=60) as mgr:
                a, b = Component("a"), Component("b")
                mgr.register(a, ready_hook=slow_hook, stream_group="solo")
                mgr.register(b)
                silent = Component("silent")
                mgr.register(silent)  # b's batch stays open
                held = await mgr.request(a, block())
                mgr.allocate(b, block())
                async with anyio.create_task_group() as tg:
                    tg.start_soon(outcome, mgr, b, block())
                    await anyio.sleep(30)
        assert scope.cancelled_caught
        assert held.arrays  # what was handed out is freed all the same
        assert_released(mgr, sim)
        assert slow_hook_done.is_set()  # the hook task was cancelled and waited for


# -- item 9: `async with` after close() ---------------------------------------------------------
async def test_async_with_after_close_is_refused() -> None:
    sim = SimulatorBackend(64 * MiB)
    mgr = MemoryManager(sim)
    async with mgr:
        pass
    mgr.close()
    with pytest.raises(ManagerStateError, match="closed"):
        async with mgr:
            pass
    part = Component()
    mgr.register(part)
    with pytest.raises(ManagerStateError, match="closed with close"):
        await mgr.request(part, block())
    assert sim.used == 0


# -- item 10: aclose() from another task ---------------------------------------------------------
async def test_aclose_from_another_task_fails_pending_and_releases(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=60) as mgr:
            a = Component("a")
            mgr.register(a)
            silent = Component("silent")
            mgr.register(silent)
            held = mgr.allocate(a, block())
            results: list[object] = []

            async def ask() -> None:
                results.append(await outcome(mgr, a, block()))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                while not queued(mgr):
                    await anyio.sleep(0.001)
                closer_done = anyio.Event()

                async def closer() -> None:
                    await mgr.aclose()
                    closer_done.set()

                tg.start_soon(closer)
                await closer_done.wait()
            assert isinstance(results[0], ManagerStateError)
            assert held.arrays and sim.used == 0 and not mgr.running
            with pytest.raises(ManagerStateError, match="not running"):
                await mgr.request(a, block())
        assert_released(mgr, sim)
    mgr.unregister(silent)  # its batches close at once from now on
    with anyio.fail_after(10):
        async with mgr:  # and it can be entered again
            response = await mgr.request(a, block())
            assert response.arrays["x"].shape == (4, MiB // 64)
    assert_released(mgr, sim)


# -- item 11: requests from another thread's event loop -----------------------------------------
@pytest.mark.parametrize("foreign", ["asyncio", "trio"])
async def test_request_from_a_foreign_loop_fails_at_once_and_the_group_goes_on(foreign: str) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0.001) as mgr:
            a = Component("a")
            mgr.register(a)
            errors: list[BaseException] = []

            async def from_there() -> None:
                try:
                    await mgr.request(a, block())
                except BaseException as exc:
                    errors.append(exc)

            def in_thread() -> None:
                if foreign == "asyncio":
                    asyncio.run(from_there())
                else:
                    trio.run(from_there)

            await anyio.to_thread.run_sync(in_thread)
            (error,) = errors
            assert isinstance(error, ManagerStateError)
            assert "event loop" in str(error) and "thread" in str(error)
            # the owner's group is untouched: its own requests are served
            async with mgr.request(a, block()) as response:
                assert response.arrays
            assert sim.used == 0


# -- item 12: a backend the manager created is closed on exit ----------------------------------
async def test_backend_made_by_the_manager_is_closed_on_exit() -> None:
    before = {t for t in threading.enumerate() if t.name.startswith("aiocubie-sim-stream-")}
    mgr = MemoryManager("simulator")
    for _ in range(2):  # and it is made usable again on the next entry
        async with mgr:
            parts = [Component() for _ in range(3)]
            for i, part in enumerate(parts):
                mgr.register(part, stream_group=f"g{i}")
            for part in parts:
                async with mgr.request(part, block()):
                    pass
            ours = {t for t in threading.enumerate() if t.name.startswith("aiocubie-sim-stream-")} - before
            assert ours
        with anyio.fail_after(5):
            while any(t.is_alive() for t in ours):
                await anyio.sleep(0.005)
    mgr.close()


async def test_a_backend_given_to_the_manager_is_left_open() -> None:
    sim = SimulatorBackend(64 * MiB)
    async with MemoryManager(sim) as mgr:
        part = Component()
        mgr.register(part)
        await mgr.request(part, block())
    assert sim.device.streams and all(not s.closed for s in sim.device.streams)
    sim.close()


# -- the adversarial suite --------------------------------------------------------------------
EXITS = ["normal", "cancelled", "aclose from a task", "aclose mid-request", "foreign threads"]


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_exits_release_everything(seed: int) -> None:
    """Managers under load end by every path; each time nothing is left live or running."""
    rng = random.Random(seed)
    threads_before = sim_stream_threads()
    for round_ in range(scale(12, 120)):
        exit_by = EXITS[round_ % len(EXITS)] if round_ < len(EXITS) else rng.choice(EXITS)
        owned = rng.random() < 0.3
        sim = SimulatorBackend(32 * MiB, latency=rng.choice([0.0, 0.0005]))
        mgr = MemoryManager("simulator" if owned else sim, batch_window=rng.choice([0, 0.001, 0.02]))
        device = mgr.backend
        ended: list[object] = []
        with anyio.fail_after(10):
            with anyio.CancelScope() as outer:
                async with mgr:
                    parts = [Component(i) for i in range(rng.randint(1, 5))]
                    for part in parts:
                        mgr.register(part, stream_group=rng.choice(["g0", "g1"]))

                    async def requester(part: Component) -> None:
                        for _ in range(rng.randint(1, 20)):
                            result = await outcome(mgr, part, block(rng.choice([0.1, 1])))
                            ended.append(result)
                            if isinstance(result, ManagerStateError):
                                return
                            if isinstance(result, ArrayResponse) and rng.random() < 0.7:
                                mgr.release(result)

                    async def foreign_attempt() -> None:
                        def there() -> None:
                            async def ask() -> None:
                                with pytest.raises(ManagerStateError, match="thread"):
                                    await mgr.request(parts[0], block())

                            asyncio.run(ask()) if rng.random() < 0.5 else trio.run(ask)

                        await anyio.to_thread.run_sync(there)

                    async with anyio.create_task_group() as tg:
                        for part in parts:
                            tg.start_soon(requester, part)
                        await anyio.sleep(rng.choice([0, 0.001, 0.005]))
                        if exit_by == "cancelled":
                            outer.cancel()
                        elif exit_by.startswith("aclose"):
                            if exit_by == "aclose mid-request":
                                await anyio.sleep(0)
                            tg.start_soon(mgr.aclose)
                        elif exit_by == "foreign threads":
                            for _ in range(rng.randint(1, 3)):
                                tg.start_soon(foreign_attempt)
                    # normal, aclose and foreign: the requesters ran to their end
        assert not mgr.running
        assert mgr.statistics().allocations == 0 and mgr.stats().live_bytes == 0
        assert device.used == 0  # type: ignore[attr-defined]
        assert all(isinstance(r, (ArrayResponse, AiocubieError)) for r in ended)
        if not owned:
            sim.close()
        else:
            mgr.close()
    with anyio.fail_after(5):  # every stream thread of these managers stopped
        while sim_stream_threads() > threads_before:
            await anyio.sleep(0.005)
