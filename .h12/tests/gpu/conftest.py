"""GPU-only fixtures: one CudaBackend for the session, swapped between allocators per module.

Every test here is marked ``gpu`` and is skipped, with the reason, where numba finds no usable
GPU. Nothing imports numba.cuda at collection time.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_HERE = Path(__file__).parent


def _gpu_status() -> tuple[bool, str]:
    try:
        from aiocubie._backends._cuda import cuda_usable
    except ImportError as exc:
        return False, f"aiocubie._backends._cuda cannot be imported: {exc}"
    return cuda_usable()


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
    """The CUDA backend module, imported only once a GPU test runs."""
    return importlib.import_module("aiocubie._backends._cuda")


@pytest.fixture(scope="session")
def cuda_backend(cu: ModuleType) -> Iterator[Any]:
    """The session's one CudaBackend (numba's memory manager is process-global)."""
    backend = cu.CudaBackend()
    yield backend
    backend.set_allocator("default")  # leave numba as later tests expect it
    backend.close()


@pytest.fixture(scope="module", params=["default", "cupy", "cupy_async"])
def backend(request: pytest.FixtureRequest, cuda_backend: Any) -> Any:
    """The session's backend on each allocator in turn (module scope: one swap per allocator)."""
    name = request.param
    if name != "default":
        pytest.importorskip("cupy")
    if cuda_backend.allocator != name:
        cuda_backend.set_allocator(name)
    return cuda_backend


@pytest.fixture(scope="session")
def kernels() -> Any:
    """Small numba kernels, compiled on first use."""
    from numba import cuda

    class Kernels:
        @staticmethod
        @cuda.jit
        def sleep(flag: Any, ns: int) -> None:  # pragma: no cover - runs on the GPU
            # Keep the stream busy for about ``ns`` nanoseconds, then mark it done.
            slept = 0
            while slept < ns:
                cuda.nanosleep(1000)
                slept += 1000
            flag[0] = 1

        @staticmethod
        @cuda.jit
        def fill_chunk(out: Any, start: int, runs: int) -> None:  # pragma: no cover - runs on the GPU
            # Element (i, j) of the chunk starting at run ``start`` holds i * runs + start + j + 1.
            i, j = cuda.grid(2)
            if i < out.shape[0] and j < out.shape[1]:
                out[i, j] = i * runs + start + j + 1

        @staticmethod
        @cuda.jit
        def add_one(a: Any) -> None:  # pragma: no cover - runs on the GPU
            i = cuda.grid(1)
            if i < a.size:
                a[i] += 1

    return Kernels
