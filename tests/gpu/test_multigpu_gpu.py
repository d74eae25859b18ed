"""Two GPUs: a backend and a manager on device 1, and a DeviceSet over both. Skipped with fewer.

Device 0's backend is the session's; device 1 gets its own. Every array is checked to live on
the device its manager drives. A device is made current where a call needs it and left so (no
push and pop around calls): what runs in ``on_device()`` runs on that manager's device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from gpukit import require

from aiocubie import ArrayRequest, DeviceSet, MemoryKind, MemoryManager, current_cupy_stream, walk_chunks
from aiocubie.errors import ConfigurationError

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


@pytest.fixture(scope="module")
def gpus(cu: Any) -> int:
    count = cu.driver_device_count()[0]
    if count < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {count}")
    return count


@pytest.fixture
def device1(cu: Any, gpus: int, cuda_backend: Any) -> Iterator[Any]:
    """A backend on device 1 with the session backend's resource."""
    backend = cu.create_cuda_backend(device=1, allocator=cuda_backend.resource.name)
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
        cu.create_cuda_backend(device=gpus)
    with pytest.raises(ConfigurationError, match=f"this process sees {gpus}"):
        MemoryManager("cuda", device=gpus)


@pytest.mark.parametrize("allocator", ["driver", "cupy", "cupy_async", "numba"])
@pytest.mark.parametrize("array_type", ["cupy", "numba"])
def test_device1_allocates_fills_and_copies_on_device1(cu: Any, gpus: int, allocator: str, array_type: str) -> None:
    pytest.importorskip("cupy")
    require(allocator)
    require("numba" if array_type == "numba" else "cupy")
    before = _current()
    backend = cu.create_cuda_backend(device=1, allocator=allocator, array_type=array_type)
    device, resource, arrays = backend.device, backend.resource, backend.arrays
    try:
        assert device.device_id == 1 and _current() == before  # opening a device is not choosing it

        def alloc(shape: tuple[int, ...], dtype: Any, kind: MemoryKind, stream: Any) -> Any:
            dtype = np.dtype(dtype)
            block = resource.allocate(int(np.prod(shape)) * dtype.itemsize, kind, stream)
            return arrays.make(block, shape, dtype, stream)

        stream = device.create_stream()
        with cu.CudaDevice(0).activate():  # device 0 current: device 1's calls must still land on device 1
            array = alloc((64 << 20,), np.uint8, MemoryKind.DEVICE, stream)
            assert _device_of(array) == 1
            assert device.memory_info().total > 0
            device.zero(array, stream)
            host = device.host_array((64 << 20,), np.dtype(np.uint8), MemoryKind.PINNED)
            host[:] = 7
            device.copy(array, host, stream)
            device.record_event(stream).synchronize()
            assert not host.any()
            managed = alloc((1024,), np.float32, MemoryKind.MANAGED, stream)
            device.prefetch(managed, 1, stream)
            device.prefetch(managed, 0, stream)  # to the other GPU
            device.advise(managed, "preferred_location", 1)
            device.record_event(stream).synchronize()
    finally:
        backend.close()


async def test_manager_on_device1_serves_walks_with_kernels(device1: Any) -> None:
    cupy = pytest.importorskip("cupy")
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
