"""aiocubie.dask under dask-cuda's LocalCUDACluster, one worker on GPU 0 with dask-cuda's RMM pool.

The plugin, registered through the client once the cluster is up, comes after dask-cuda's RMM
plugin: with ``allocator="rmm"`` the worker's manager wraps the pool dask-cuda installed (its
blocks come from that pool, counted in its statistics), its budget is the pool's maximum size or
dask-cuda's ``device_memory_limit``, and active-mode caps hold. Skipped without dask-cuda, RMM or
a GPU. The worker is another process: each check runs in a task there and returns what it saw.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aiocubie import ArrayRequest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
POOL, MAXIMUM, DEVICE_LIMIT = 256 * MiB, 1024 * MiB, 768 * MiB


class Part:
    """A registered component (one per task)."""


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    pytest.importorskip("rmm", reason='allocator "rmm" needs RMM: pip install "aiocubie[rmm]"')
    dask_cuda = pytest.importorskip("dask_cuda", reason="needs dask-cuda (and its dask, distributed)")
    import cloudpickle
    from distributed import Client

    # the worker is a process of its own: send this module's tasks by value, not by a name it cannot import
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with (
        dask_cuda.LocalCUDACluster(
            n_workers=1,
            threads_per_worker=1,
            rmm_pool_size=POOL,
            rmm_maximum_pool_size=MAXIMUM,
            device_memory_limit=DEVICE_LIMIT,
            rmm_allocator_external_lib_list=["cupy"],  # dask-cuda routes CuPy to RMM: another library in the pool
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def register(client: Any, **options: Any) -> None:
    from aiocubie.dask import ManagerPlugin

    client.register_plugin(ManagerPlugin(backend="cuda", allocator="rmm", batch_window=0, **options))


async def what_the_worker_has() -> dict[str, Any]:
    """The worker's RMM resource stack, its plugins and its manager's budget."""
    import rmm
    from distributed import get_worker

    from aiocubie.dask import get_manager

    mgr = get_manager()
    current = rmm.mr.get_current_device_resource()
    chain = [type(current).__name__]
    resource = current
    while hasattr(resource, "get_upstream") and len(chain) < 8:  # adaptors down to the resource at the bottom
        resource = resource.get_upstream()
        chain.append(type(resource).__name__)
    upstream = mgr.backend.resource.upstream  # type: ignore[attr-defined]
    return {
        "chain": chain,
        "upstream": type(upstream).__name__,
        "upstream_is_installed_below_ours": upstream is current.get_upstream().get_upstream(),
        "pool_size": int(upstream.pool_size()) if hasattr(upstream, "pool_size") else None,
        "plugins": sorted(type(p).__name__ for p in get_worker().plugins.values()),
        "allocator": mgr.pool.allocator,
        "total": mgr.pool.memory_info().total,
        "memory_limit": mgr.options.memory_limit,
    }


async def request_through_the_pool(nbytes: int) -> dict[str, Any]:
    """Request ``nbytes`` through the manager while CuPy (through RMM, dask-cuda's hook) holds some too."""
    import cupy
    import rmm

    from aiocubie.dask import get_manager

    mgr, part = get_manager(), Part()
    statistics = rmm.mr.get_current_device_resource()
    mgr.register(part, stream_group="pool")
    before, counted_before = mgr.stats(), int(statistics.allocation_counts.current_bytes)
    async with mgr.request(part, {"x": ArrayRequest((nbytes // 4,), np.float32)}) as response:
        theirs = cupy.empty(777_777, dtype=np.uint8)  # CuPy's own allocation, through dask-cuda's RMM hook
        stats = mgr.stats()
        seen = {
            "array_bytes": int(response.arrays["x"].nbytes),
            "live": stats.live_bytes - before.live_bytes,
            "other": stats.other_bytes - before.other_bytes,
            "counted": int(statistics.allocation_counts.current_bytes) - counted_before,
            "pool_in_use_matches": stats.pool.in_use == stats.live_bytes + stats.other_bytes,
        }
        response.arrays["x"].fill(1)
        seen["sum"] = float(response.arrays["x"].sum())
        del theirs
    del response  # the arrays hold the block's memory: with them gone, the pool has it back
    seen["after"] = int(statistics.allocation_counts.current_bytes) - counted_before
    mgr.unregister(part)
    return seen


async def capped_job(i: int, proportion: float, nbytes: int) -> dict[str, Any]:
    """A chunked job of ``nbytes`` under a cap of ``proportion`` of the manager's budget."""
    from aiocubie.dask import get_manager

    mgr, part = get_manager(), Part()
    group = f"job-{i}"
    mgr.register(part, stream_group=group, proportion=proportion)
    async with mgr.request(part, {"x": ArrayRequest((4, nbytes // 16), np.float32, chunk_axis=1)}) as response:
        chunks = response.chunks
    usage = mgr.stats().groups[group]
    seen = {"chunks": chunks, "peak": usage.peak_bytes, "cap": usage.cap_bytes, "budget": mgr.pool.memory_info().total}
    mgr.unregister(part)
    return seen


def test_the_manager_wraps_dask_cudas_pool_and_takes_its_maximum_as_budget(client: Any) -> None:
    register(client, budget="rmm_maximum_pool_size", mode="active", policy="wait")
    seen = client.submit(what_the_worker_has, pure=False).result()
    assert "RMMSetup" in seen["plugins"] and "ManagerPlugin" in seen["plugins"]  # dask-cuda's ran, ours after
    assert seen["allocator"] == "rmm"
    # aiocubie's stack on top, dask-cuda's pool (rmm.reinitialize's PoolMemoryResource) kept under it
    assert seen["chain"][:3] == ["StatisticsResourceAdaptor", "FailureCallbackResourceAdaptor", "PoolMemoryResource"]
    assert seen["upstream"] == "PoolMemoryResource" and seen["upstream_is_installed_below_ours"]
    assert seen["pool_size"] >= POOL
    assert seen["total"] == seen["memory_limit"] == MAXIMUM


def test_blocks_come_from_the_pool_counted_with_the_other_libraries(client: Any) -> None:
    register(client, budget="rmm_maximum_pool_size")
    seen = client.submit(request_through_the_pool, 64 * MiB, pure=False).result()
    assert seen["array_bytes"] == seen["live"] == 64 * MiB
    assert seen["other"] == 777_777  # CuPy's, in the same pool
    assert seen["counted"] == 64 * MiB + 777_777  # the pool's statistics count both, to the byte
    assert seen["pool_in_use_matches"]
    assert seen["sum"] == 16 * MiB and seen["after"] == 0


def test_caps_hold_under_the_pools_budget(client: Any) -> None:
    register(client, budget="rmm_maximum_pool_size", mode="active", policy="wait")
    # four jobs of 512 MiB, each capped at 1/8 of the 1 GiB maximum: chunked, every peak under its cap
    jobs = [client.submit(capped_job, i, 0.125, 512 * MiB, pure=False) for i in range(4)]
    for seen in client.gather(jobs):
        assert seen["budget"] == MAXIMUM and seen["cap"] == MAXIMUM // 8
        assert seen["chunks"] >= 4 and seen["peak"] <= seen["cap"]


def test_the_budget_can_be_dask_cudas_device_memory_limit(client: Any) -> None:
    register(client, budget="device_memory_limit", mode="active")
    seen = client.submit(what_the_worker_has, pure=False).result()
    assert seen["total"] == seen["memory_limit"] == DEVICE_LIMIT
    assert seen["chain"][:3] == ["StatisticsResourceAdaptor", "FailureCallbackResourceAdaptor", "PoolMemoryResource"]
    seen = client.submit(capped_job, 9, 0.25, 512 * MiB, pure=False).result()
    assert seen["cap"] == DEVICE_LIMIT // 4 and seen["peak"] <= seen["cap"]
