"""aiocubie.dask on a LocalCluster of in-process workers, each with its own simulated device.

Workers run in this process (processes=False) on the test's event loop, so the tests can look at
each worker's manager directly. Waits are bounded by fail_after as a safety net, never asserted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")
import anyio
from distributed import Client, LocalCluster, Worker

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.dask import PLUGIN_NAME, ManagerPlugin, get_manager
from aiocubie.errors import AllocationError, ManagerStateError
from aiocubie.simulator import SimulatorBackend

MiB = 1 << 20
#: What tasks keep between calls on one worker, keyed by the worker's address.
HELD: dict[str, dict[str, Any]] = {}


class Component:
    """A registrable stand-in for a solver."""


@asynccontextmanager
async def cluster(workers: int, plugin: ManagerPlugin | None) -> AsyncIterator[tuple[Client, list[Worker]]]:
    async with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=False, asynchronous=True, dashboard_address=None
        ) as local,
        Client(local, asynchronous=True) as client,
    ):
        if plugin is not None:
            await client.register_plugin(plugin)
        yield client, list(local.workers.values())
    HELD.clear()


def manager_of(worker: Worker) -> MemoryManager:
    plugin = worker.plugins[PLUGIN_NAME]
    assert isinstance(plugin, ManagerPlugin) and plugin.manager is not None
    return plugin.manager


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(30):  # a safety net: the condition comes about through the cluster's messages
        while not condition():
            await asyncio.sleep(0.005)


async def chunk_sum(i: int) -> tuple[int, int, float]:
    mgr = get_manager()
    component = Component()
    mgr.register(component, stream_group=f"chunk-{i}")
    async with mgr.request(component, {"x": ArrayRequest((1000,), np.float64)}) as response:
        response.arrays["x"][...] = i
        return mgr.device, response.chunks, float(response.arrays["x"].sum())


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())  # type: ignore[arg-type]


def test_setup_gives_each_worker_a_manager_and_tasks_get_it() -> None:
    async def main() -> None:
        async with cluster(2, ManagerPlugin(backend="simulator", mode="active", policy="wait")) as (client, workers):
            results = await client.gather(client.map(chunk_sum, range(6)))
            assert results == [(0, 1, 1000.0 * i) for i in range(6)]
            managers = [manager_of(w) for w in workers]
            assert managers[0] is not managers[1] and all(m.running for m in managers)
            assert all(m.budget.mode.value == "active" and m.budget.policy.value == "wait" for m in managers)
            await client.unregister_worker_plugin(PLUGIN_NAME)
            assert not any(m.running for m in managers)  # teardown closed them
            assert all(PLUGIN_NAME not in w.plugins for w in workers)

    run(main)


def test_get_manager_outside_a_worker_or_without_the_plugin() -> None:
    with pytest.raises(ManagerStateError, match="called outside one"):
        get_manager()

    async def main() -> None:
        async with cluster(1, None) as (client, _):
            with pytest.raises(ManagerStateError, match="has no aiocubie manager: register the plugin first"):
                await client.submit(chunk_sum, 0)

    run(main)


def test_plugin_refuses_bad_settings_and_setup_reports_bad_options() -> None:
    with pytest.raises(Exception, match="backend must be a name"):
        ManagerPlugin(backend=SimulatorBackend())  # type: ignore[arg-type]
    with pytest.raises(Exception, match="device must be a device number"):
        ManagerPlugin(device=-1)

    async def main() -> None:
        async with cluster(1, None) as (client, _):
            with pytest.raises(Exception, match="mode"):
                await client.register_plugin(ManagerPlugin(backend="simulator", mode="sideways"))

    run(main)


async def hold(nbytes: int) -> None:
    """Register a component on this worker and keep an allocation for it."""
    mgr = get_manager()
    worker = HELD.setdefault(get_worker_address(), {})
    component = worker.setdefault("component", Component())
    if not mgr.is_registered(component):
        mgr.register(component, stream_group="held", proportion=0.001)
    worker.setdefault("responses", []).append(
        await mgr.request(component, {"x": ArrayRequest((nbytes,), np.uint8, unchunkable=True)})
    )


async def wait_for_room(nbytes: int) -> None:
    """Ask for more than the component's cap leaves: waits (policy "wait") until cancelled."""
    mgr = get_manager()
    worker = HELD[get_worker_address()]
    worker["waiting"] = True
    await mgr.request(worker["component"], {"x": ArrayRequest((nbytes,), np.uint8, unchunkable=True)})


def get_worker_address() -> str:
    from distributed import get_worker

    return str(get_worker().address)


# the waiting task's component holds the first task's memory (in the worker's thread: no pytest.warns)
@pytest.mark.filterwarnings("ignore:.*waits for memory its own requester:aiocubie.errors.AiocubieWarning")
def test_a_task_cancelled_by_dask_withdraws_its_request() -> None:
    async def main() -> None:
        async with cluster(1, ManagerPlugin(backend="simulator", mode="active", policy="wait", batch_window=0)) as (
            client,
            workers,
        ):
            mgr = manager_of(workers[0])
            cap = int(0.001 * mgr.pool.memory_info().total)
            await client.submit(hold, cap // 2)
            waiting = client.submit(wait_for_room, cap // 2 + cap // 4)
            await until(lambda: HELD[workers[0].address].get("waiting", False))
            await client.cancel(waiting)
            stats = lambda: mgr.stats().groups["held"]  # noqa: E731
            await until(lambda: stats().cancellations == 1)
            assert stats().live_bytes == cap // 2  # what the first task holds stays held
            held: list[ArrayResponse] = HELD[workers[0].address]["responses"]
            mgr.release(held.pop())
            assert mgr.stats().live_bytes == 0
            await client.submit(hold, cap // 2 + cap // 4, pure=False)  # the room is there again
            assert stats().live_bytes == cap // 2 + cap // 4

    run(main)


def test_a_closed_worker_frees_its_own_arrays_only() -> None:
    async def main() -> None:
        async with cluster(2, ManagerPlugin(backend="simulator", mode="active", batch_window=0)) as (client, workers):
            managers = [manager_of(w) for w in workers]
            for worker in workers:
                await client.submit(hold, 3 * MiB, workers=[worker.address], pure=False)
            assert [m.stats().live_bytes for m in managers] == [3 * MiB, 3 * MiB]
            backends = [m.backend for m in managers]
            await workers[0].close()
            assert not managers[0].running and backends[0].used == 0  # type: ignore[attr-defined]
            assert managers[1].running and managers[1].stats().live_bytes == 3 * MiB
            assert backends[1].used == 3 * MiB  # type: ignore[attr-defined]
            survivor = HELD[workers[1].address]["responses"][0]
            assert survivor.arrays["x"].nbytes == 3 * MiB  # still valid, still held

    run(main)


def test_a_failed_allocation_reaches_the_task_and_the_client() -> None:
    """Failing a batch copies its error for each task: with distributed's tblib pickling installed too."""

    async def main() -> None:
        async with cluster(1, ManagerPlugin(backend="simulator", batch_window=0)) as (client, workers):
            mgr = manager_of(workers[0])
            mgr.backend.faults.inject("allocate")  # type: ignore[attr-defined]
            with pytest.raises(AllocationError, match="injected fault"):
                await client.submit(chunk_sum, 0)
            assert await client.submit(chunk_sum, 1) == (0, 1, 1000.0)  # the manager serves on
            assert mgr.stats().live_bytes == 0

    run(main)
