"""Where a GPU's blocks come from: one memory resource per allocator, and the host kinds they share.

``driver`` is the device's stream-ordered pool through cuda.core (``cuMemAllocFromPoolAsync``, what
cubie 0.17 uses); ``cupy`` and ``cupy_async`` are CuPy's ``MemoryPool`` and ``MemoryAsyncPool``.
Every resource serves the other kinds alike: pinned and mapped host memory (``cuMemHostAlloc``),
managed memory (``cuMemAllocManaged``, never more than the device has free) and pageable host
memory (numpy). A resource builds no arrays, keeps no ledger and never frees memory an array
still uses: a block's memory goes back when the last holder of its ``handle`` goes.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Protocol

import numpy as np
from cuda.bindings import driver as binding
from cuda.core import DeviceMemoryResource, DeviceMemoryResourceOptions

from ..._errors import AllocationError
from ..._names import MemoryKind
from .._resource import Block, MemoryResource, PoolFacts
from ._errors import check, map_exceptions, translate
from ._streams import as_stream, cupy_view, import_cupy

__all__ = ["CudaResource", "CupyAsyncResource", "CupyResource", "DeviceContext", "DriverResource", "HostAllocation"]


class DeviceContext(Protocol):
    """What a resource needs of its device (``CudaDevice`` is one): the device hands itself to the
    resources it makes, and this module never imports the device's."""

    device_id: int
    device_name: str
    granule: int
    context: Any

    def make_current(self) -> None: ...
    def synchronize(self) -> None: ...
    def driver_memory(self) -> tuple[int, int]: ...
    def free_text(self) -> str: ...
    def activate(self) -> contextlib.AbstractContextManager[Any]: ...


_HOST_ALLOC_PINNED = binding.CU_MEMHOSTALLOC_PORTABLE
_HOST_ALLOC_MAPPED = binding.CU_MEMHOSTALLOC_PORTABLE | binding.CU_MEMHOSTALLOC_DEVICEMAP
_ATTACH_GLOBAL = binding.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value
_INVALID_CONTEXT = binding.CUresult.CUDA_ERROR_INVALID_CONTEXT


def _free(free: Any, ptr: int, context: Any) -> None:
    # The last holder may go on any thread, one with no context current: lend ours for the call.
    if free(ptr)[0] == _INVALID_CONTEXT:
        binding.cuCtxPushCurrent(context)
        try:
            free(ptr)
        finally:
            binding.cuCtxPopCurrent()


class HostAllocation:
    """Page-locked host memory from ``cuMemHostAlloc``, freed when the last holder goes."""

    __slots__ = ("__weakref__", "context", "nbytes", "ptr")

    def __init__(self, nbytes: int, flags: int, context: Any) -> None:
        self.ptr = 0
        err, ptr = binding.cuMemHostAlloc(nbytes, flags)
        check((err,), lambda: f"pinning {nbytes} bytes of host memory")
        self.ptr, self.nbytes, self.context = int(ptr), nbytes, context

    def __del__(self) -> None:
        if self.ptr:
            _free(binding.cuMemFreeHost, self.ptr, self.context)


class ManagedAllocation:
    """Managed (unified) memory from ``cuMemAllocManaged``, freed when the last holder goes."""

    __slots__ = ("__weakref__", "context", "nbytes", "ptr")

    def __init__(self, nbytes: int, context: Any) -> None:
        self.ptr = 0
        err, ptr = binding.cuMemAllocManaged(nbytes, _ATTACH_GLOBAL)
        check((err,), lambda: f"allocating {nbytes} bytes of managed memory")
        self.ptr, self.nbytes, self.context = int(ptr), nbytes, context

    def __del__(self) -> None:
        if self.ptr:
            _free(binding.cuMemFree, self.ptr, self.context)


class CudaResource(MemoryResource):
    """A GPU's memory resource: device blocks from :meth:`_device_block`, the other kinds alike for all.

    Parameters
    ----------
    device : DeviceContext
        The device it allocates on (made current where an allocation needs it).
    """

    def __init__(self, device: DeviceContext) -> None:
        self._device = device

    def allocate(self, nbytes: int, kind: MemoryKind, stream: Any) -> Block:
        if kind is MemoryKind.DEVICE and nbytes:  # the request path's case first
            try:
                return self._device_block(nbytes, stream)
            except Exception as exc:
                mapped = translate(
                    exc,
                    lambda: f"allocating {nbytes} bytes of device memory with the {self.name} allocator",
                    self._device.free_text,
                )
                if mapped is None:
                    raise
                raise mapped from exc
        kind = MemoryKind(kind)
        if not nbytes:
            return Block(0, 0, kind, stream, None)
        if kind is MemoryKind.HOST:
            try:
                array = np.empty(nbytes, np.uint8)
            except MemoryError as exc:
                raise AllocationError(f"the host has not {nbytes} bytes of pageable memory free") from exc
            return Block(int(array.ctypes.data), nbytes, kind, stream, array)
        with map_exceptions(lambda: f"allocating {nbytes} bytes of {kind.value} memory", self._device.free_text):
            if kind is MemoryKind.PINNED or kind is MemoryKind.MAPPED:
                self._device.make_current()  # the context the memory is first registered with
                flags = _HOST_ALLOC_PINNED if kind is MemoryKind.PINNED else _HOST_ALLOC_MAPPED
                host = HostAllocation(nbytes, flags, self._device.context)
                # Under unified addressing a mapped block's device address is its host address.
                return Block(host.ptr, nbytes, kind, stream, host)
            self._refuse_managed_beyond_free(nbytes)
            self._device.make_current()
            managed = ManagedAllocation(nbytes, self._device.context)
            return Block(managed.ptr, nbytes, kind, stream, managed)

    def deallocate(self, block: Block) -> None:
        """Nothing to do now: the block's ``handle`` frees its memory (stream-ordered where the
        resource is) once the last array over it goes."""

    @abc.abstractmethod
    def _device_block(self, nbytes: int, stream: Any) -> Block:
        """A device block of ``nbytes`` (> 0) bytes ordered on ``stream``."""

    def _refuse_managed_beyond_free(self, nbytes: int) -> None:
        # Oversubscribing managed memory can hang the GPU: refuse before the driver sees it,
        # keeping a granule spare for whatever else allocates meanwhile.
        device = self._device
        free, total = device.driver_memory()
        if nbytes + device.granule > free:
            self.release_cached()  # blocks a pool keeps are device memory managed arrays could use
            free, total = device.driver_memory()
        if nbytes + device.granule > free:
            raise AllocationError(
                f"refusing {nbytes} bytes of managed memory: only {free} of {total} bytes are free on "
                f"{device.device_name}, less a {device.granule}-byte margin; free some device memory first"
            )

    def _freed_by(self, release: Any) -> int:
        """Run ``release()`` and return the device bytes it made free."""
        before, _ = self._device.driver_memory()
        with map_exceptions(f"releasing the {self.name} pool's cached blocks"):
            release()
        after, _ = self._device.driver_memory()
        return max(0, after - before)


class DriverResource(CudaResource):
    """Device blocks from the device's stream-ordered pool (cuda.core ``DeviceMemoryResource``).

    Allocation and the eventual free are ordered on the allocation's stream; the pool keeps freed
    memory for reuse (its release threshold is left as the process set it).
    """

    name = "driver"

    def __init__(self, device: DeviceContext, *, max_size: int | None = None) -> None:
        super().__init__(device)
        with map_exceptions("opening the device's memory pool"):
            if max_size is None:
                self._pool = DeviceMemoryResource(device.device_id)
            else:  # a pool of its own that never holds more than max_size bytes
                self._pool = DeviceMemoryResource(device.device_id, DeviceMemoryResourceOptions(max_size=max_size))

    def _device_block(self, nbytes: int, stream: Any) -> Block:
        buffer = self._pool.allocate(nbytes, stream=as_stream(stream))
        return Block(int(buffer.handle), nbytes, MemoryKind.DEVICE, stream, buffer)

    def release_cached(self) -> int:
        """Let queued frees land (a device sync), then trim the pool to what is in use."""
        handle = self._pool.handle

        def trim() -> None:
            self._device.synchronize()
            check(binding.cuMemPoolTrimTo(handle, 0), "trimming the device's memory pool")

        return self._freed_by(trim)

    def pool_facts(self) -> PoolFacts:
        """The pool's reserved and used bytes (every user of the device's pool counts)."""
        with map_exceptions("reading the device pool's attributes"):
            attributes = self._pool.attributes
            return PoolFacts(held=int(attributes.reserved_mem_current), in_use=int(attributes.used_mem_current))


class CupyResource(CudaResource):
    """Device blocks from a CuPy ``MemoryPool`` of its own (not CuPy's default pool).

    The pool serves the current device's blocks: the device is made current first (a cheap
    check when it already is).
    """

    name = "cupy"

    def __init__(self, device: DeviceContext) -> None:
        super().__init__(device)
        self._cupy = cupy = import_cupy()
        self._pool = self._new_pool(cupy)
        self._make_current = device.make_current

    def _new_pool(self, cupy: Any) -> Any:
        return cupy.cuda.MemoryPool()

    def _device_block(self, nbytes: int, stream: Any) -> Block:
        self._make_current()
        pointer = self._pool.malloc(nbytes)
        return Block(pointer.ptr, nbytes, MemoryKind.DEVICE, stream, pointer)

    def release_cached(self) -> int:
        return self._freed_by(self._pool.free_all_blocks)

    def pool_facts(self) -> PoolFacts:
        """The pool's ``total_bytes`` and ``used_bytes``; CuPy does not say its largest cached block."""
        with map_exceptions(f"reading the {self.name} pool's bytes"):
            return PoolFacts(held=int(self._pool.total_bytes()), in_use=int(self._pool.used_bytes()))


class CupyAsyncResource(CupyResource):
    """Device blocks from a CuPy ``MemoryAsyncPool`` (``cudaMallocAsync`` on the device's pool).

    CuPy allocates on its current stream: the allocation's stream is bound for the call (one CuPy
    view per stream, kept while the resource lives), so each block is freed on its own stream,
    which the block's handle keeps alive until then.
    """

    name = "cupy_async"

    def _new_pool(self, cupy: Any) -> Any:
        return cupy.cuda.MemoryAsyncPool()

    def _device_block(self, nbytes: int, stream: Any) -> Block:
        self._make_current()
        with cupy_view(self._cupy, stream):
            pointer = self._pool.malloc(nbytes)
        # CuPy frees the block on this stream when the pointer goes: the handle holds the stream
        # too, so the stream outlives the block (a tuple drops its last item first).
        return Block(pointer.ptr, nbytes, MemoryKind.DEVICE, stream, (stream, pointer))

    def release_cached(self) -> int:
        def release() -> None:
            self._device.synchronize()  # frees queued on streams land first
            self._pool.free_all_blocks()

        return self._freed_by(release)
