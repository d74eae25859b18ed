"""GPU-only fixtures: one CudaDevice for the session, each CUDA resource in turn, CuPy kernels.

Every test here is marked ``gpu`` and is skipped, with the reason, where no usable GPU is found.
Nothing imports a CUDA library at collection time. The kernels are CuPy's (``RawKernel``), so the
whole GPU suite runs without numba-cuda; numba's own tests skip when it is not importable.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from gpukit import RESOURCES, require

from aiocubie._requests import MemoryKind

_HERE = Path(__file__).parent


def _gpu_status() -> tuple[bool, str]:
    from aiocubie._backends import gpu_status

    return gpu_status()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if "gpu" in item.keywords and _HERE in item.path.parents]
    if not mine:
        return
    usable, why = _gpu_status()
    if not usable:
        skip = pytest.mark.skip(reason=f"no usable GPU: {why}")
        for item in mine:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cu() -> ModuleType:
    """The CUDA backend package, imported only once a GPU test runs."""
    return importlib.import_module("aiocubie._backends._cuda")


@pytest.fixture(scope="session")
def device(cu: ModuleType) -> Iterator[Any]:
    """The session's CudaDevice on GPU 0."""
    gpu = cu.CudaDevice(0)
    yield gpu
    gpu.close()


@pytest.fixture(scope="module", params=RESOURCES)
def resource(request: pytest.FixtureRequest, device: Any) -> Any:
    """Each CUDA resource in turn (module scope: one resource a module)."""
    require(request.param)
    made = device.create_resource(request.param)
    yield made
    made.release_cached()


@pytest.fixture(scope="session")
def cuda_backend(cu: ModuleType) -> Iterator[Any]:
    """The session's GPU backend: device 0, the default resource, CuPy arrays."""
    backend = cu.create_cuda_backend(device=0)
    yield backend
    backend.close()


@pytest.fixture(scope="module", params=RESOURCES)
def backend(request: pytest.FixtureRequest, cu: ModuleType) -> Iterator[Any]:
    """A GPU backend on each resource in turn (module scope)."""
    require(request.param)
    made = cu.create_cuda_backend(device=0, allocator=request.param)
    yield made
    made.close()


@pytest.fixture(scope="session")
def arrays(cu: ModuleType, device: Any) -> Any:
    """CuPy arrays over blocks (the default array type)."""
    pytest.importorskip("cupy")
    return cu.CupyArrays(device.device_id)


class Alloc:
    """``alloc(shape, dtype, kind, stream)``: an array from the module's resource, as the account makes one."""

    def __init__(self, resource: Any, arrays: Any) -> None:
        self.resource, self.arrays = resource, arrays

    def __call__(self, shape: tuple[int, ...], dtype: Any, kind: MemoryKind, stream: Any) -> Any:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        block = self.resource.allocate(nbytes, kind, stream)
        return self.arrays.make(block, shape, dtype, stream)


@pytest.fixture
def alloc(resource: Any, arrays: Any) -> Alloc:
    """Arrays from the module's resource through CuPy's array maker."""
    return Alloc(resource, arrays)


_SOURCE = r"""
extern "C" __global__ void sleep_then_flag(int* flag, long long ns) {
    long long slept = 0;
    while (slept < ns) { __nanosleep(1000); slept += 1000; }
    flag[0] = 1;
}
extern "C" __global__ void add_one(float* a, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += 1.0f;
}
extern "C" __global__ void fill_chunk(double* out, long long rows, long long cols, long long start, long long runs) {
    long long i = (long long)blockIdx.y;
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows && j < cols) out[i * cols + j] = (double)(i * runs + start + j + 1);
}
extern "C" __global__ void fill_chunk_f32(float* out, long long rows, long long cols, long long start, long long runs) {
    long long i = (long long)blockIdx.y;
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows && j < cols) out[i * cols + j] = (float)(i * runs + start + j + 1);
}
"""


class Kernels:
    """Small CUDA kernels (CuPy ``RawModule``), each queued on the stream it is given."""

    def __init__(self, cupy: Any, cu: ModuleType) -> None:
        module = cupy.RawModule(code=_SOURCE)
        self._sleep = module.get_function("sleep_then_flag")
        self._add_one = module.get_function("add_one")
        self._fill = {8: module.get_function("fill_chunk"), 4: module.get_function("fill_chunk_f32")}
        self._cu = cu
        self._np = cupy

    def sleep(self, stream: Any, flag: Any, ns: int) -> None:
        """Keep ``stream`` busy about ``ns`` nanoseconds, then set ``flag[0]`` (an int32 array) to 1."""
        with self._cu.current_cupy_stream(stream):
            self._sleep((1,), (1,), (flag, np.int64(ns)))

    def add_one(self, stream: Any, array: Any) -> None:
        """Add 1 to every element of a float32 array."""
        n = int(array.size)
        with self._cu.current_cupy_stream(stream):
            self._add_one(((n + 255) // 256,), (256,), (array, np.int64(n)))

    def fill_chunk(self, stream: Any, out: Any, start: int, runs: int) -> None:
        """Element (i, j) of a float64 or float32 chunk starting at run ``start`` gets i * runs + start + j + 1."""
        rows, cols = out.shape
        with self._cu.current_cupy_stream(stream):
            self._fill[out.dtype.itemsize](
                ((cols + 127) // 128, rows),
                (128,),
                (out, np.int64(rows), np.int64(cols), np.int64(start), np.int64(runs)),
            )


@pytest.fixture(scope="session")
def kernels(cu: ModuleType) -> Kernels:
    """CuPy kernels (compiled on first use)."""
    cupy = pytest.importorskip("cupy")
    return Kernels(cupy, cu)
