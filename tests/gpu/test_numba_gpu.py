"""The numba extra on a real GPU: numba arrays over every resource's blocks, numba kernels on
cuda.core streams, and the EMM plugin that makes numba's own allocations draw from the chosen
resource (seed 001). Skipped where numba-cuda is not installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aiocubie._requests import MemoryKind

pytestmark = pytest.mark.gpu

pytest.importorskip("numba_cuda", reason="the numba extra is not installed")


@pytest.fixture(scope="module")
def numba_arrays(device: Any) -> Any:
    from aiocubie._backends._numba import NumbaArrays

    return NumbaArrays(device)


@pytest.fixture(scope="module")
def add_one() -> Any:
    from numba import cuda

    @cuda.jit
    def kernel(a: Any) -> None:  # pragma: no cover - runs on the GPU
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1

    return kernel


@pytest.mark.parametrize("kind", [MemoryKind.DEVICE, MemoryKind.MANAGED, MemoryKind.MAPPED], ids=lambda k: k.value)
def test_numba_arrays_over_every_resource(
    device: Any, resource: Any, numba_arrays: Any, add_one: Any, kind: MemoryKind
) -> None:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    stream = device.create_stream()
    n = 100_000
    block = resource.allocate(n * 4, kind, stream)
    array = numba_arrays.make(block, (n,), np.dtype(np.float32), stream)
    assert isinstance(array, DeviceNDArray) and array.shape == (n,)
    expected = np.arange(n, dtype=np.float32)
    device.copy(expected, array, stream)
    add_one[(n + 255) // 256, 256, stream](array)  # a numba kernel on a cuda.core stream
    out = np.empty_like(expected)
    device.copy(array, out, stream)
    device.record_event(stream).synchronize()
    assert np.array_equal(out, expected + 1)


def test_host_kinds_are_numpy(device: Any, resource: Any, numba_arrays: Any) -> None:
    for kind in (MemoryKind.HOST, MemoryKind.PINNED):
        array = numba_arrays.make(resource.allocate(80, kind, None), (10,), np.dtype(np.float64), None)
        assert isinstance(array, np.ndarray) and array.shape == (10,)


@pytest.mark.parametrize("name", ["driver", "cupy", "cupy_async"])
def test_numba_allocations_draw_from_the_chosen_resource(device: Any, name: str) -> None:
    """With numba in use, making a resource installs the EMM plugin: numba's own allocations use it."""
    from numba import cuda

    if name != "driver":
        pytest.importorskip("cupy")
    resource = device.create_resource(name)
    try:
        before = resource.pool_facts().in_use
        array = cuda.device_array(8 << 20, dtype=np.uint8)  # numba's own allocation, 8 MiB
        after = resource.pool_facts().in_use
        assert after - before >= 8 << 20, f"{name}: numba's allocation did not come from the resource"
        array.copy_to_device(np.ones(8 << 20, np.uint8))
        assert int(array.copy_to_host().sum()) == 8 << 20
        del array
    finally:
        # numba's own manager back, as the rest of the session expects
        from aiocubie._backends._numba import install_memory_manager

        install_memory_manager(device, None)


def test_numba_resource_uses_numbas_own_manager(device: Any) -> None:
    from numba import cuda

    from aiocubie._backends._numba import install_memory_manager

    resource = device.create_resource("numba")
    assert type(cuda.current_context().memory_manager).__name__ == "NumbaCUDAMemoryManager"
    block = resource.allocate(1 << 20, MemoryKind.DEVICE, None)
    assert block.ptr and block.nbytes == 1 << 20
    install_memory_manager(device, None)
