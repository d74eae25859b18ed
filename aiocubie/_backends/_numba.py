"""numba on a GPU (the ``numba`` extra): numba arrays over blocks, the ``numba`` resource, the EMM plugin.

The only module of aiocubie that imports numba. :class:`NumbaArrays` builds numba device arrays
over any resource's blocks; :class:`NumbaResource` allocates device memory with numba's own memory
manager; :func:`install_memory_manager` makes numba's own allocations (``cuda.device_array`` and
friends in user code) draw from a chosen aiocubie resource (numba's External Memory Management
plugin, seed 001). It never calls numba's host-side array API to allocate aiocubie's memory.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any, ClassVar

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver as nbdriver
from numba.cuda.cudadrv.devicearray import DeviceNDArray

from .._names import MemoryKind
from ._arrays import ArrayMaker
from ._cuda._arrays import c_strides, host_array
from ._cuda._errors import map_exceptions
from ._cuda._resources import CudaResource, DeviceContext
from ._cuda._streams import stream_handle
from ._resource import Block, MemoryResource, PoolFacts

__all__ = ["NumbaArrays", "NumbaResource", "install_memory_manager", "numba_context"]

_HOST_KINDS = (MemoryKind.HOST, MemoryKind.PINNED)


def numba_context(device: DeviceContext) -> Any:
    """numba's context for ``device`` (its primary context, as cuda.core's), leaving the current one as it was."""
    with device.activate(), map_exceptions(f"opening numba's context on CUDA device {device.device_id}"):
        return cuda.gpus[device.device_id].get_primary_context()


class NumbaArrays(ArrayMaker):
    """numba ``DeviceNDArray`` over device-side blocks; numpy arrays over host ones.

    Parameters
    ----------
    device : DeviceContext
        The device the blocks live on.
    """

    name = "numba"

    def __init__(self, device: DeviceContext) -> None:
        self._context = numba_context(device)
        self._streams: dict[int, Any] = {}

    def make(self, block: Block, shape: tuple[int, ...], dtype: np.dtype[Any], stream: Any) -> Any:
        if block.kind in _HOST_KINDS:
            return host_array(block, shape, dtype)
        handle = block.handle
        if not block.nbytes:
            gpu_data = None  # numba makes its own NULL pointer for an empty array
        elif isinstance(handle, nbdriver.MemoryPointer):
            gpu_data = handle
        else:  # numba's pointer holds the block's handle until the array goes
            gpu_data = nbdriver.MemoryPointer(
                weakref.proxy(self._context), ctypes.c_void_p(block.ptr), block.nbytes, owner=handle
            )
        return DeviceNDArray(
            shape, c_strides(shape, dtype.itemsize), dtype, stream=self._stream(stream), gpu_data=gpu_data
        )

    def _stream(self, stream: Any) -> Any:
        """numba's view of ``stream`` (numba arrays name a numba stream in their interface), made once a stream."""
        key = stream_handle(stream)
        if not key:
            return 0
        view = self._streams.get(key)
        if view is None:
            view = self._streams[key] = cuda.external_stream(key)
        return view


class NumbaResource(CudaResource):
    """Device blocks from numba's own memory manager (``cuMemAlloc``, frees deferred by numba).

    Parameters
    ----------
    device : DeviceContext
        The device it allocates on.
    """

    name = "numba"

    def __init__(self, device: DeviceContext) -> None:
        super().__init__(device)
        self._context = numba_context(device)
        # numba's own manager, whatever plugin is installed for numba's other allocations
        self._manager = nbdriver.NumbaCUDAMemoryManager(context=self._context)
        self._manager.initialize()

    def _device_block(self, nbytes: int, stream: Any) -> Block:
        self._device.make_current()  # cuMemAlloc allocates in the current context
        pointer = self._manager.memalloc(nbytes)
        return Block(int(pointer.device_pointer_value or 0), nbytes, MemoryKind.DEVICE, stream, pointer)

    def release_cached(self) -> int:
        """Run the frees numba deferred (it batches them); numba keeps no pool besides."""
        return self._freed_by(self._manager.deallocations.clear)

    def pool_facts(self) -> PoolFacts:
        return PoolFacts()


class _ResourceMemoryManager(nbdriver.GetIpcHandleMixin, nbdriver.HostOnlyCUDAMemoryManager):  # type: ignore[misc]
    """numba EMM plugin: numba's device allocations drawn from an aiocubie resource (``resource`` below).

    numba gives no stream: blocks are ordered on the legacy default stream, which waits for
    every blocking stream (and is waited for by them).
    """

    resource: ClassVar[MemoryResource]

    def memalloc(self, size: int) -> Any:
        block = self.resource.allocate(size, MemoryKind.DEVICE, None)
        return nbdriver.MemoryPointer(weakref.proxy(self.context), ctypes.c_void_p(block.ptr), size, owner=block.handle)

    def initialize(self) -> None:
        pass

    def get_memory_info(self) -> Any:
        free, total = nbdriver.driver.cuMemGetInfo()
        facts = self.resource.pool_facts()
        return nbdriver.MemoryInfo(free=free + (facts.cached or 0), total=total)

    def reset(self) -> None:
        super().reset()
        self.resource.release_cached()

    @property
    def interface_version(self) -> int:
        return 1


def install_memory_manager(device: DeviceContext, resource: MemoryResource | None) -> None:
    """Make numba's own device allocations on ``device`` draw from ``resource`` (None: numba's own manager).

    Sets the plugin for contexts numba creates later too (numba's choice is process-wide), and
    swaps the manager of ``device``'s live context; arrays numba allocated before keep the manager
    that allocated them. A ``numba`` resource needs no plugin: numba's own manager is put back.
    """
    if resource is None or resource.name == "numba":
        plugin: type[Any] = nbdriver.NumbaCUDAMemoryManager
    else:
        plugin = type(f"AiocubieMemoryManager_{resource.name}", (_ResourceMemoryManager,), {"resource": resource})
    nbdriver.set_memory_manager(plugin)
    context = numba_context(device)
    manager = plugin(context=context)
    manager.initialize()
    context.memory_manager = manager
