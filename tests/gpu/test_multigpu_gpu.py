"""Two GPUs: a backend and a manager on device 1, and a DeviceSet over both. Skipped with fewer.

Device 0's backend is the session's (numba's memory manager is process-wide); device 1 gets
its own. Every array is checked to live on the device its manager drives, and the thread's
current context is checked to be left as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aiocubie import (
    ArrayRequest,
    ConfigurationError,
    DeviceSet,
    MemoryKind,
    MemoryManager,
    current_cupy_stream,
    walk_chunks,
)

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


@pytest.fixture(scope="module")
def gpus() -> int:
    from numba import cuda

    count = len(cuda.gpus)
    if count < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {count}")
    return count


@pytest.fixture
def device1(cu: Any, gpus: int, cuda_backend: Any) -> Iterator[Any]:
    """A backend on device 1 with the session backend's allocator."""
    backend = cu.CudaBackend(allocator=cuda_backend.allocator, device=1)
    yield backend
    backend.close()


def _current() -> int:
    from cuda.bindings import driver

    return int(driver.cuCtxGetCurrent()[1])


def _device_of(array: Any) -> int:
    """The GPU an array's memory is on, as the CUDA runtime says (through CuPy).

    Not the driver's CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: on the two-H200 run it read 0 even
    for a raw cuMemAlloc in device 1's context, whose 2 GiB device 1's free memory lost.
    """
    import cupy

    from aiocubie._backends._cuda._arrays import device_pointer

    return int(cupy.cuda.runtime.pointerGetAttributes(device_pointer(array)).device)


def test_a_device_that_does_not_exist_is_refused(cu: Any, gpus: int) -> None:
    with pytest.raises(ConfigurationError, match=f"no CUDA device {gpus}: this process sees {gpus}"):
        cu.CudaBackend(device=gpus)
    with pytest.raises(ConfigurationError, match=f"this process sees {gpus}"):
        MemoryManager("cuda", device=gpus)


@pytest.mark.parametrize("allocator", ["default", "cupy", "cupy_async"])
@pytest.mark.parametrize("array_type", ["cupy", "numba"])
def test_device1_allocates_fills_and_copies_on_device1(cu: Any, gpus: int, allocator: str, array_type: str) -> None:
    pytest.importorskip("cupy")
    before = _current()
    backend = cu.CudaBackend(allocator=allocator, array_type=array_type, device=1)
    try:
        assert backend.device == 1 and _current() == before
        stream = backend.create_stream()
        array = backend.allocate((64 << 20,), np.dtype(np.uint8), MemoryKind.DEVICE, stream)
        assert _device_of(array) == 1
        assert backend.memory_info().total > 0
        backend.zero(array, stream)
        host = backend.host_array((64 << 20,), np.dtype(np.uint8), MemoryKind.PINNED)
        host[:] = 7
        backend.copy(array, host, stream)
        backend.record_event(stream).synchronize()
        assert not host.any()
        managed = backend.allocate((1024,), np.dtype(np.float32), MemoryKind.MANAGED, stream)
        backend.prefetch(managed, 1, stream)
        backend.prefetch(managed, 0, stream)  # to the other GPU
        backend.advise(managed, "preferred_location", 1)
        backend.record_event(stream).synchronize()
        assert _current() == before  # every call popped what it pushed
    finally:
        backend.close()


async def test_manager_on_device1_serves_walks_with_kernels(device1: Any) -> None:
    cupy = pytest.importorskip("cupy")
    before = _current()
    async with MemoryManager(device1, mode="active") as mgr:
        assert mgr.device == 1
        solver = object.__new__(type("Solver", (), {}))
        mgr.register(solver, proportion=0.001, stream_group="solve")  # chunks on any GPU
        runs = 50_000_000
        host = np.arange(runs, dtype=np.float32)
        out = np.empty_like(host)
        requests = {"x": ArrayRequest((runs,), np.float32, chunk_axis=0)}
        async with mgr.request(solver, requests) as response:
            assert response.chunks > 1
            async for chunk in walk_chunks(response, inputs={"x": host}, outputs={"x": out}):
                with mgr.on_device(), current_cupy_stream(chunk.stream):
                    assert cupy.cuda.runtime.getDevice() == 1
                    x = chunk.device["x"]
                    assert x.device.id == 1
                    x *= 2
        np.testing.assert_array_equal(out, host * 2)
        group = mgr.stats().groups["solve"]
        assert group.cap_bytes is not None and 0 < group.peak_bytes <= group.cap_bytes
    assert _current() == before


async def test_device_set_over_two_gpus(cuda_backend: Any, device1: Any) -> None:
    pytest.importorskip("cupy")
    backends = {0: cuda_backend, 1: device1}
    async with DeviceSet([0, 1], backend=backends.__getitem__, mode="active") as devices:
        solvers = [type("Solver", (), {})() for _ in range(4)]
        placed = [devices.register(s, proportion=0.01, stream_group=f"s{i}") for i, s in enumerate(solvers)]
        assert sorted(placed) == [0, 0, 1, 1]
        for solver in solvers:
            response = await devices.request(solver, {"x": ArrayRequest((1 << 20,), np.float32, zero=True)})
            assert _device_of(response.arrays["x"]) == devices.device_of(solver)
            devices.manager_of(solver).release(response)
        stats = devices.stats()
        assert set(stats) == {0, 1} and all(s.live_bytes == 0 for s in stats.values())
        for solver in solvers:
            devices.unregister(solver)
