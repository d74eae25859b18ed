"""The ``rmm`` resource on a real GPU: it wraps the device's RMM resource, counts every library, recovers for them.

Skipped where RMM is not installed (the rmm extra). Each test makes its own manager; the stack
aiocubie installs over the device's RMM resource is shared by all of them (one per device).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryKind, MemoryManager, mr
from aiocubie.errors import OutOfMemoryError

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

MiB = 1 << 20


@pytest.fixture
def rmm() -> Iterator[Any]:
    rmm = pytest.importorskip("rmm", reason='allocator "rmm" needs RMM: pip install "aiocubie[rmm]"')
    yield rmm
    cupy = sys.modules.get("cupy")
    if cupy is not None:  # share_pool("cupy") set CuPy's allocator process-wide: give it its own pool back
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)


class Part:
    """A registered component."""


async def test_it_wraps_the_installed_resource_and_counts_every_library(rmm: Any) -> None:
    cupy = pytest.importorskip("cupy")
    mgr, part = MemoryManager("cuda", allocator="rmm"), Part()
    current = rmm.mr.get_current_device_resource()
    assert isinstance(current, rmm.mr.StatisticsResourceAdaptor)  # ours, over what was installed
    assert isinstance(current.get_upstream(), rmm.mr.FailureCallbackResourceAdaptor)
    mgr.pool.share("cupy")
    mgr.register(part)
    async with mgr:
        before = mgr.stats()
        response = await mgr.request(part, {"x": ArrayRequest((MiB,), np.float32)})
        theirs = cupy.empty(777_777, dtype=np.uint8)
        stats = mgr.stats()
        assert stats.live_bytes == 4 * MiB
        assert stats.other_bytes - before.other_bytes == 777_777
        assert stats.pool.in_use - before.pool.in_use == 4 * MiB + 777_777  # to the byte
        del theirs
        assert mgr.stats().other_bytes == before.other_bytes
        assert response.arrays["x"].data.ptr != 0


def test_blocks_are_ordered_on_the_groups_stream(rmm: Any, device: Any) -> None:
    resource = device.create_resource("rmm")
    stream = device.create_stream()
    block = resource.allocate(8000, MemoryKind.DEVICE, stream)
    # RMM keeps the buffer's stream private (it frees there, and keeps the stream alive till then)
    assert isinstance(block.handle, rmm.DeviceBuffer) and block.handle.size == 8000 and block.ptr
    assert block.stream is stream


async def test_a_library_out_of_memory_runs_the_reclaim_hooks(rmm: Any) -> None:
    cupy = pytest.importorskip("cupy")
    mgr, part = MemoryManager("cuda", allocator="rmm"), Part()
    mgr.pool.share("cupy")
    mgr.register(part)
    asked: list[int] = []
    mgr.pool.add_reclaim_hook(lambda nbytes: asked.append(nbytes) or 0)
    async with mgr:
        total = mgr.pool.memory_info().total
        with pytest.raises(MemoryError):  # CuPy's own error: nothing freed, it fails as it would alone
            cupy.empty(2 * total, dtype=np.uint8)
        assert asked == [2 * total]
        assert mgr.stats().recovery.out_of_memory == 1


def test_the_hard_cap_inside_the_allocator_refuses_what_is_over_it(rmm: Any, device: Any) -> None:
    resource = device.create_resource("rmm")
    capped = mr.LimitingAdaptor(resource, 8 * MiB)
    stream = device.create_stream()
    first = capped.allocate(6 * MiB, MemoryKind.DEVICE, stream)
    with pytest.raises(OutOfMemoryError):
        capped.allocate(4 * MiB, MemoryKind.DEVICE, stream)
    assert capped.held == 6 * MiB
    capped.deallocate(first)
    assert capped.held == 0


async def test_torch_allocations_count_against_the_instance(rmm: Any) -> None:
    torch = pytest.importorskip("torch")
    mgr, part = MemoryManager("cuda", allocator="rmm"), Part()
    mgr.register(part)
    async with mgr:
        # the pool is the process's: an earlier test's garbage freed meanwhile would move in_use
        gc.collect()
        before = mgr.stats()
        with mgr.pool.torch_allocations(part) as scope:
            tensor = torch.ones(MiB // 4, device="cuda")  # 1 MiB in a segment torch rounds up
        stats = mgr.stats()
        assert scope.held >= MiB and stats.live_bytes == scope.held
        assert stats.other_bytes == before.other_bytes  # torch's bytes are the instance's, not "other"
        assert stats.pool.in_use - before.pool.in_use == scope.held  # to the byte, as RMM counts them
        del tensor
