"""aiocubie.dask under dask-cuda, on the simulator: the budget a worker's manager takes, and the plugins' order.

Workers run in this process (processes=False), started as dask-cuda starts them: with dask-cuda's
own plugins and data passed to each worker (``plugins=``, ``data=``). Where a test needs dask-cuda's
classes it skips without dask-cuda (not in the test extras: it pins dask); the GPU side, a real
LocalCUDACluster with an RMM pool, is tests/gpu/test_dask_cuda_gpu.py.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")
from distributed import Client, LocalCluster, Worker

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.dask import BUDGETS, PLUGIN_NAME, ManagerPlugin, get_manager
from aiocubie.errors import ConfigurationError
from aiocubie.simulator import SimulatorBackend

MiB = 1 << 20


class Component:
    """A registrable stand-in for a solver."""


@asynccontextmanager
async def cluster(plugin: ManagerPlugin | None = None, **worker: Any) -> AsyncIterator[tuple[Client, Worker]]:
    """One in-process worker; ``worker``: what dask-cuda passes its workers (``plugins``, ``data``)."""
    async with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, asynchronous=True, dashboard_address=None, **worker
        ) as local,
        Client(local, asynchronous=True) as client,
    ):
        if plugin is not None:
            await client.register_plugin(plugin)
        yield client, next(iter(local.workers.values()))


def manager_of(worker: Worker) -> MemoryManager:
    plugin = worker.plugins[PLUGIN_NAME]
    assert isinstance(plugin, ManagerPlugin) and plugin.manager is not None
    return plugin.manager


def run(main: Any) -> None:
    asyncio.run(main())


def sim(**options: Any) -> ManagerPlugin:
    return ManagerPlugin(backend="simulator", batch_window=0, **options)


# -- on the client ----------------------------------------------------------------------------
def test_the_budget_is_one_of_the_names_and_travels_to_the_workers() -> None:
    assert BUDGETS == ("device", "rmm_maximum_pool_size", "device_memory_limit")
    for bad in ("rmm_pool_size", None, 1 << 30, "DEVICE"):
        with pytest.raises(ConfigurationError, match="unknown budget") as info:
            ManagerPlugin(budget=bad)  # type: ignore[arg-type]
        assert repr(bad) in str(info.value) and "'device_memory_limit'" in str(info.value)
    with pytest.raises(ConfigurationError, match="both say what each worker's manager budgets: pass one"):
        ManagerPlugin(budget="device_memory_limit", memory_limit=MiB)
    plugin = pickle.loads(pickle.dumps(ManagerPlugin(backend="simulator", budget="device_memory_limit", mode="active")))
    assert (plugin.budget, plugin.backend, plugin.options) == ("device_memory_limit", "simulator", {"mode": "active"})
    assert ManagerPlugin(memory_limit=MiB).budget == "device"


# -- memory_limit: the manager's budget -----------------------------------------------------------
@pytest.mark.anyio
async def test_memory_limit_is_the_device_the_manager_budgets() -> None:
    backend = SimulatorBackend(64 * MiB)
    mgr = MemoryManager(backend, memory_limit=16 * MiB, mode="active", batch_window=0, headroom=0)
    solver, other = Component(), Component()
    mgr.register(solver, proportion=0.5, stream_group="a")
    mgr.register(other, proportion=0.25, stream_group="b")
    assert mgr.pool.memory_info().total == 16 * MiB and mgr.options.memory_limit == 16 * MiB
    assert (mgr.budget.cap(solver), mgr.budget.cap(other)) == (
        8 * MiB,
        4 * MiB,
    )  # proportions of the limit, not of 64 MiB
    async with mgr:
        # 16 MiB asked of a cap of 8: two chunks (on the whole device's budget it would be one of 32)
        async with mgr.request(solver, {"x": ArrayRequest((4, 4 * MiB // 4), np.float32, chunk_axis=1)}) as response:
            assert response.chunks == 2 and response.arrays["x"].nbytes == 8 * MiB
            assert mgr.pool.memory_info().free == 8 * MiB  # what the limit leaves; the device has 56 MiB free
            assert backend.device.memory_info().free >= 56 * MiB - 1024
        assert mgr.pool.memory_info().free == 16 * MiB
    mgr.close()


@pytest.mark.anyio
async def test_memory_limit_counts_other_libraries_bytes_in_the_pool() -> None:
    backend = SimulatorBackend(64 * MiB, allocator="rmm")
    mgr = MemoryManager(backend, memory_limit=16 * MiB, batch_window=0)
    solver = Component()
    mgr.register(solver)
    async with mgr:
        theirs = backend.library_allocate(6 * MiB)  # torch's, CuPy's... through the same pool
        assert mgr.pool.memory_info().free == 10 * MiB
        async with mgr.request(solver, {"x": ArrayRequest((16 * MiB,), np.uint8)}) as response:
            assert response.chunks > 1 and response.arrays["x"].nbytes <= 10 * MiB  # planned in what is left
        backend.library_free(theirs)
        del theirs  # the block's handle keeps its memory in the pool's use, as on a GPU
        assert mgr.pool.memory_info().free == 16 * MiB
    mgr.close()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8GB"])
def test_a_memory_limit_that_is_not_bytes_is_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="memory_limit must be the device bytes the manager budgets") as info:
        MemoryManager("simulator", memory_limit=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)


# -- the budget from the worker -------------------------------------------------------------------
def test_memory_limit_reaches_each_workers_manager() -> None:
    async def main() -> None:
        async with cluster(sim(memory_limit=12 * MiB)) as (_, worker):
            assert manager_of(worker).pool.memory_info().total == 12 * MiB

    run(main)


def test_a_budget_the_worker_does_not_have_fails_the_setup_saying_what_to_start_with() -> None:
    async def main() -> None:
        async with cluster() as (client, worker):
            with pytest.raises(ConfigurationError, match="has no device memory limit") as info:
                await client.register_plugin(sim(budget="device_memory_limit"))
            assert "LocalCUDACluster(device_memory_limit=...)" in str(info.value)
            with pytest.raises(ConfigurationError, match="has no dask-cuda RMM plugin") as info:
                await client.register_plugin(sim(budget="rmm_maximum_pool_size"))
            assert "LocalCUDACluster(rmm_pool_size=..., rmm_maximum_pool_size=...)" in str(info.value)
            plugin = worker.plugins.get(PLUGIN_NAME)
            assert plugin is None or plugin.manager is None  # no manager where the setup failed

    run(main)


def device_host_file(limit: int | None) -> tuple[type, dict[str, Any]]:
    """dask-cuda's worker data, as LocalCUDACluster(device_memory_limit=limit) gives each worker."""
    device_host_file = pytest.importorskip("dask_cuda.device_host_file", reason="needs dask-cuda")
    return device_host_file.DeviceHostFile, {"device_memory_limit": limit, "memory_limit": None}


def test_budget_device_memory_limit_is_dask_cudas_spilling_limit() -> None:
    async def main() -> None:
        async with cluster(sim(budget="device_memory_limit", mode="active"), data=device_host_file(24 * MiB)) as (
            client,
            worker,
        ):
            mgr = manager_of(worker)
            assert mgr.pool.memory_info().total == 24 * MiB and mgr.options.memory_limit == 24 * MiB

            async def task() -> int:
                mgr, part = get_manager(), Component()
                mgr.register(part, proportion=0.5)
                return mgr.budget.cap(part)

            assert await client.submit(task) == 12 * MiB
        async with cluster(data=device_host_file(None)) as (client, _):  # no limit: spilling off
            with pytest.raises(ConfigurationError, match="no device memory limit .*DeviceHostFile"):
                await client.register_plugin(sim(budget="device_memory_limit"))

    run(main)


#: dask-cuda's RMM plugin's settings as LocalCUDACluster passes them: no pool (rmm_pool_size=None), so no RMM needed.
RMM_SETTINGS: dict[str, Any] = {
    "initial_pool_size": None,
    "maximum_pool_size": None,
    "managed_memory": False,
    "async_alloc": False,
    "release_threshold": None,
    "log_directory": None,
    "track_allocations": False,
    "external_lib_list": None,
}


def rmm_setup(**sizes: Any) -> Any:
    """dask-cuda's RMM plugin, made with ``RMM_SETTINGS`` and ``sizes``."""
    plugins = pytest.importorskip("dask_cuda.plugins", reason="needs dask-cuda")
    return plugins.RMMSetup(**(RMM_SETTINGS | sizes))


def test_budget_rmm_maximum_pool_size_needs_a_pool_with_a_maximum() -> None:
    async def main() -> None:
        # rmm_maximum_pool_size without rmm_pool_size or rmm_async: dask-cuda installs no pool, so no maximum
        async with cluster(plugins=[rmm_setup(maximum_pool_size=32 * MiB)]) as (client, _):
            with pytest.raises(ConfigurationError, match="has no maximum size") as info:
                await client.register_plugin(sim(budget="rmm_maximum_pool_size"))
            assert "rmm_pool_size=None, rmm_async=False, rmm_maximum_pool_size=None" in str(info.value)

    run(main)


def test_budget_rmm_maximum_pool_size_is_the_pools_maximum() -> None:
    plugins = pytest.importorskip("dask_cuda.plugins", reason="needs dask-cuda")

    class PooledRMMSetup(plugins.RMMSetup):  # type: ignore[misc,name-defined]
        """dask-cuda's RMM plugin with its pool made (no RMM here: tests/gpu/test_dask_cuda_gpu.py makes a real one)."""

        def setup(self, worker: Any = None) -> None:
            self.initial_pool_size, self.maximum_pool_size = 16 * MiB, 48 * MiB  # what its setup parses them to

    async def main() -> None:
        setup = PooledRMMSetup(**(RMM_SETTINGS | {"initial_pool_size": "16MiB", "maximum_pool_size": "48MiB"}))
        async with cluster(sim(budget="rmm_maximum_pool_size"), plugins=[setup]) as (_, worker):
            assert manager_of(worker).pool.memory_info().total == 48 * MiB

    run(main)


# -- the order: dask-cuda's RMM plugin first --------------------------------------------------------
def test_registered_through_the_client_it_comes_after_dask_cudas_rmm_plugin() -> None:
    async def main() -> None:
        async with cluster(sim(allocator="rmm"), plugins=[rmm_setup()]) as (client, worker):
            mgr = manager_of(worker)
            assert mgr.pool.allocator == "rmm" and mgr.running

            async def task() -> int:
                mgr, part = get_manager(), Component()
                mgr.register(part)
                async with mgr.request(part, {"x": ArrayRequest((1000,), np.float64)}) as response:
                    return int(response.arrays["x"].nbytes)

            assert await client.submit(task) == 8000

    run(main)


def test_set_up_before_dask_cudas_rmm_plugin_it_refuses() -> None:
    async def main() -> None:
        # both passed with the worker's own plugins, aiocubie's first: distributed sets them up together
        with pytest.raises(RuntimeError, match="Worker failed to start") as info:
            async with cluster(plugins=[sim(allocator="rmm"), rmm_setup()]):
                pass
        cause = info.value.__cause__
        assert isinstance(cause, ConfigurationError) and "before dask-cuda's RMM plugin" in str(cause)
        assert "client.register_plugin(aiocubie.dask.ManagerPlugin(...))" in str(cause)
        async with cluster(plugins=[rmm_setup(), sim(allocator="rmm")]) as (_, worker):  # the other way round: fine
            assert manager_of(worker).allocator == "rmm"
        async with cluster(plugins=[sim(allocator="cupy"), rmm_setup()]) as (_, worker):  # not rmm: no order
            assert manager_of(worker).allocator == "cupy"

    run(main)
