"""What the contract suites share: the backends they run on, and allocating as the device account does.

Every case is a backend name, a resource name and an array type. The simulator's cases always
run; the CUDA cases (marked ``gpu``) are collected where a usable GPU is found, one per CUDA
resource, so that ``pytest tests/contract`` on a GPU machine checks every resource there.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import attrs
import numpy as np
import pytest

from aiocubie import MemoryKind, mr
from aiocubie._backends import ARRAY_TYPES, Backend, Block, Device, MemoryResource, gpu_status

__all__ = ["CASES", "DEVICE_SIDE", "HOST_SIDE", "RESOURCES", "Contract", "to_numpy"]

#: Every resource a backend may offer (``"default"`` is one of these, resolved by the device), and
#: ``"composed"``: a user's stack of every adaptor over CuPy's pool, registered here as a user would.
RESOURCES = ("driver", "cupy", "cupy_async", "numba", "rmm", "composed")


def composed(device: Device) -> MemoryResource:
    """Statistics over a limit over a failure callback over CuPy's pool: each adaptor passes the contract through."""
    failing = mr.FailureCallbackAdaptor(device.create_resource("cupy"), lambda nbytes: False)
    return mr.StatisticsAdaptor(mr.LimitingAdaptor(failing, 1 << 62))


for _backend in ("simulator", "cuda"):
    mr.register_allocator("composed", composed, backend=_backend)
DEVICE_SIDE = (MemoryKind.DEVICE, MemoryKind.MANAGED, MemoryKind.MAPPED)
HOST_SIDE = (MemoryKind.PINNED, MemoryKind.HOST)

GPU, WHY_NOT = gpu_status()
NUMBA = importlib.util.find_spec("numba") is not None


def _case(backend: str, resource: str, array_type: str) -> Any:
    marks = [pytest.mark.gpu] if backend == "cuda" else []
    if "numba" in (resource, array_type) and not NUMBA:
        marks.append(pytest.mark.skip(reason="numba is the numba extra, not installed: pip install 'aiocubie[numba]'"))
    return pytest.param((backend, resource, array_type), marks=marks, id=f"{backend}-{resource}-{array_type}")


#: (backend, resource, array type) of every case this machine runs: the simulator's always,
#: the GPU's where a usable one is present.
CASES = [_case("simulator", r, t) for r in RESOURCES for t in ARRAY_TYPES] + (
    [_case("cuda", r, t) for r in RESOURCES for t in ARRAY_TYPES] if GPU else []
)


@attrs.define
class Contract:
    """A backend under test, with allocation through its resource and array maker by hand.

    ``alloc(shape, dtype, kind, stream)`` gives an array over a new block (kept in ``blocks``);
    ``free(array)`` gives its block back, as the device account does.
    """

    backend: Backend
    resource_name: str
    array_type: str
    blocks: dict[int, tuple[Any, Block]] = attrs.Factory(dict)

    @property
    def resource(self) -> MemoryResource:
        return self.backend.resource

    @property
    def device(self) -> Any:
        return self.backend.device

    def alloc(self, shape: tuple[int, ...], dtype: Any, kind: MemoryKind, stream: Any) -> Any:
        dtype = np.dtype(dtype)
        block = self.resource.allocate(math.prod(shape) * dtype.itemsize, kind, stream)
        array = self.backend.arrays.make(block, shape, dtype, stream)
        self.blocks[id(array)] = (array, block)
        return array

    def block_of(self, array: Any) -> Block:
        return self.blocks[id(array)][1]

    def free(self, array: Any) -> None:
        _, block = self.blocks.pop(id(array))
        self.resource.deallocate(block)

    def sync(self, stream: Any) -> None:
        self.device.record_event(stream).synchronize()


def to_numpy(array: Any) -> np.ndarray[Any, Any]:
    """A host copy of an array of any type (numpy, CuPy or its model, numba or its model)."""
    if isinstance(array, np.ndarray):
        return np.array(array)
    if hasattr(array, "copy_to_host"):
        return np.asarray(array.copy_to_host())
    return np.asarray(array.get())
