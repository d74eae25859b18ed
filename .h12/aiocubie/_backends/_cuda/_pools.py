"""Where blocks come from: numba's EMM plugins over CuPy pools, and one block source per kind.

The allocator (``default``, ``cupy``, ``cupy_async``) decides which pool supplies device
blocks; the same pool serves numba's own allocations through the installed EMM plugin. It
builds no arrays (``_arrays`` does) and never imports CuPy before a CuPy allocator is used.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from typing import Any, ClassVar

from numba.cuda.cudadrv import driver as nbdriver

from ._streams import import_cupy

__all__ = ["PLUGINS", "Block", "CupyAsyncPoolManager", "CupyPoolManager", "device_block", "host_block"]


def _hold(block: Any) -> None:
    """A numba finalizer that only holds ``block``: once numba drops it, CuPy gets it back."""


class CupyPoolManager(nbdriver.GetIpcHandleMixin, nbdriver.HostOnlyCUDAMemoryManager):  # type: ignore[misc]
    """Numba EMM plugin: device memory from a ``cupy.cuda.MemoryPool`` (one per context)."""

    stream_ordered: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool: Any = None

    def initialize(self) -> None:
        # numba calls this on every context lookup, so on every allocation: build the pool once
        if self.pool is None:
            cupy = import_cupy()
            self.pool = cupy.cuda.MemoryAsyncPool() if self.stream_ordered else cupy.cuda.MemoryPool()

    def memalloc(self, size: int) -> Any:
        # MemoryAsyncPool allocates on CuPy's current stream: CudaBackend.allocate binds it.
        block = self.pool.malloc(size)
        return nbdriver.MemoryPointer(
            weakref.proxy(self.context), ctypes.c_void_p(block.ptr), size, finalizer=functools.partial(_hold, block)
        )

    def get_memory_info(self) -> Any:
        # Bytes the pool keeps but no array uses are free for our next allocation.
        free, total = nbdriver.driver.cuMemGetInfo()
        return nbdriver.MemoryInfo(free=free + self.pool.free_bytes(), total=total)

    def reset(self) -> None:
        super().reset()
        if self.pool is not None:
            self.pool.free_all_blocks()

    @property
    def interface_version(self) -> int:
        return 1


class CupyAsyncPoolManager(CupyPoolManager):
    """Numba EMM plugin: stream-ordered device memory (cudaMallocAsync) from ``cupy.cuda.MemoryAsyncPool``."""

    stream_ordered = True


#: The numba memory manager each allocator installs.
PLUGINS: dict[str, type[Any]] = {
    "default": nbdriver.NumbaCUDAMemoryManager,
    "cupy": CupyPoolManager,
    "cupy_async": CupyAsyncPoolManager,
}


class Block:
    """A device-addressable block: its address, size and the object that keeps it allocated.

    ``owner`` is a CuPy ``MemoryPointer`` (pool blocks) or a numba ``MemoryPointer`` (numba's
    allocations, mapped and managed memory); the block is freed when the last array over it goes.
    """

    __slots__ = ("owner", "ptr", "size")

    def __init__(self, ptr: int, size: int, owner: Any) -> None:
        self.ptr, self.size, self.owner = ptr, size, owner


def device_block(context: Any, nbytes: int) -> Block:
    """A device block from the pool of the installed allocator.

    CuPy pools hand out their block directly (a CuPy array goes over it at no extra cost);
    numba's default manager hands out its own pointer. ``cupy_async`` allocates on CuPy's
    current stream: the caller binds the group's stream first.
    """
    pool = getattr(context.memory_manager, "pool", None)
    if pool is not None:
        block = pool.malloc(nbytes)
        return Block(block.ptr, nbytes, block)
    pointer = context.memalloc(nbytes)
    return Block(pointer.device_pointer_value or 0, nbytes, pointer)


def host_block(context: Any, nbytes: int, *, mapped: bool) -> Any:
    """Page-locked host memory (numba's ``PinnedMemory`` or, mapped, ``MappedMemory``)."""
    return context.memhostalloc(nbytes, mapped=mapped)


def managed_block(context: Any, nbytes: int) -> Block:
    """Managed (unified) memory, attached globally."""
    pointer = context.memallocmanaged(nbytes, attach_global=True)
    return Block(pointer.device_pointer_value or 0, nbytes, pointer)
