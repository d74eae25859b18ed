"""Out-of-memory recovery and pool facts on a real GPU, with the cupy allocator.

Another library's plain device allocation (``cupy.cuda.Memory``, outside the manager's pool)
takes most of the free memory, always freed at the end; nothing asks for managed memory. On
asyncio and trio. Skipped without a GPU or CuPy (see conftest.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from gpukit import alone_on_device

from aiocubie import ArrayRequest, MemoryManager

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

GiB = 1 << 30


class Part:
    """A component."""


def driver_free(device: int) -> int:
    """Free bytes on ``device`` (whatever device or context is current: other tests may change it)."""
    cupy = pytest.importorskip("cupy")
    with cupy.cuda.Device(device):
        free, _ = cupy.cuda.runtime.memGetInfo()
    return int(free)


class Hog:
    """Another library's memory on ``device``: takes all but ``leave`` bytes of what is free now."""

    def __init__(self) -> None:
        self.memory: Any = None
        self.size = 0

    def take(self, device: int, leave: int) -> None:
        cupy = pytest.importorskip("cupy")
        self.size = driver_free(device) - leave
        if self.size <= 0:
            pytest.skip(f"the GPU has less than {leave} bytes free")
        with cupy.cuda.Device(device):
            self.memory = cupy.cuda.Memory(self.size)  # cudaMalloc: plain device memory, no pool

    def give_back(self, nbytes: int = 0) -> int:
        freed, self.memory = (self.size if self.memory is not None else 0), None
        return freed


@pytest.fixture
def hog() -> Iterator[Hog]:
    alone_on_device("fills the whole device")
    hog = Hog()
    yield hog
    hog.give_back()


async def test_pool_cache_is_freed_for_a_request_larger_than_free(cuda_backend: Any, hog: Hog) -> None:
    pytest.importorskip("cupy")
    async with MemoryManager(cuda_backend, allocator="cupy") as mgr:
        gc.collect()  # arrays an earlier test's frames still hold go back to the pool first
        cuda_backend.resource.release_cached()  # the device pool's cache from earlier tests goes back
        part = Part()
        mgr.register(part, stream_group="g")
        for _ in range(2):  # two 1 GiB blocks end up cached in the pool
            mgr.allocate(part, {"x": ArrayRequest((GiB,), np.uint8)})
        mgr.free_all()
        facts = mgr.stats().pool
        assert facts.held is not None and facts.in_use is not None and facts.held - facts.in_use >= 2 * GiB
        hog.take(cuda_backend.device.device_id, leave=GiB)  # 1 GiB free on the device, 2 GiB cached in the pool
        assert driver_free(cuda_backend.device.device_id) < 2 * GiB
        request = {"x": ArrayRequest((5 * GiB // 2,), np.uint8, unchunkable=True)}  # 2.5 GiB: no cached block holds it
        async with mgr.request(part, request) as response:
            assert response.chunks == 1 and response.arrays["x"].nbytes == 5 * GiB // 2
            assert mgr.stats().pool.held < facts.held + 5 * GiB // 2  # the cached blocks went back
        # CuPy's MemoryPool frees its own cache once before it reports out-of-memory; the
        # manager's first step is the fallback for the allocators that do not
        assert mgr.stats().recovery.failed == 0


async def test_reclaim_hook_frees_memory_another_library_holds(cuda_backend: Any, hog: Hog) -> None:
    pytest.importorskip("cupy")
    async with MemoryManager(cuda_backend, allocator="cupy", free_cache_seconds=3600) as mgr:
        gc.collect()  # arrays an earlier test's frames still hold go back to the pool first
        cuda_backend.resource.release_cached()  # the device pool's cache from earlier tests goes back
        part = Part()
        mgr.register(part, stream_group="g")
        async with mgr.request(part, {"warm": ArrayRequest((1 << 20,), np.uint8)}):
            pass  # the manager reads the device now, and keeps that reading
        mgr.pool.add_reclaim_hook(hog.give_back)
        hog.take(cuda_backend.device.device_id, leave=GiB)  # unseen by the manager until it reads again
        request = {"x": ArrayRequest((2 * GiB,), np.uint8, unchunkable=True)}
        async with mgr.request(part, request) as response:
            assert response.arrays["x"].nbytes == 2 * GiB
        recovery = mgr.stats().recovery
        assert hog.memory is None, f"the hook was not needed: {recovery}, pool {mgr.stats().pool}"
    assert (recovery.out_of_memory, recovery.cache_releases, recovery.hook_calls) == (1, 1, 1)
    assert (recovery.recovered, recovery.failed) == (1, 0) and recovery.hook_bytes_freed >= GiB
