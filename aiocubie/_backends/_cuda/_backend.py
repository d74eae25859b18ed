"""The CUDA backend: blocks from the allocator's pool, arrays of the chosen type built over them.

It must never ask for more managed memory than the device has free, never destroy the shared
primary context, never import CuPy before CuPy arrays or a CuPy allocator are asked for, never
call numba's host-side array API (``device_array`` and relatives) and never let a numba or CuPy
error escape untranslated (``_errors.map_exceptions``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
from cuda.bindings import driver as binding
from numba import cuda
from numba.cuda.cudadrv import driver as nbdriver
from numba.cuda.cudadrv.error import CudaDriverError, CudaSupportError

from ..._errors import AllocationError, BackendError, ConfigurationError, InvalidRequestError, UnknownAllocatorError
from ..._requests import MemoryKind
from .._base import ALLOCATORS, Advice, Backend, MemoryInfo, PoolFacts, parse_array_type
from . import _arrays, _pools
from ._errors import check, map_exceptions
from ._events import EVENT_FLAGS, EVENT_MECHANISMS, CudaEvent, EventMechanism, StreamWaiter
from ._streams import cupy_view, import_cupy, stream_ptr

__all__ = ["CudaBackend", "cuda_usable"]

log = logging.getLogger("aiocubie")

_ADVICE = {
    "preferred_location": binding.CUmem_advise.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
    "accessed_by": binding.CUmem_advise.CU_MEM_ADVISE_SET_ACCESSED_BY,
    "read_mostly": binding.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY,
}
_IS_MANAGED = binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED
_MEMORY_TYPE = binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE


def cuda_usable() -> tuple[bool, str]:
    """Whether numba-cuda can use a GPU here, and why (or why not).

    Returns
    -------
    tuple of (bool, str)
        ``(True, "<device name> (device 0), <free>/<total> MiB free")`` or ``(False, reason)``.
    """
    try:
        if not cuda.is_available():
            reason = nbdriver.driver.initialization_error or "the CUDA driver found no GPU"
            return False, "numba.cuda is not available: " + " ".join(str(reason).split())
        free, total = cuda.current_context().get_memory_info()
        return True, f"{_device_name()} (device 0), {free >> 20}/{total >> 20} MiB free"
    except (CudaSupportError, CudaDriverError, OSError) as exc:
        return False, f"numba.cuda cannot open a context: {exc}"


def _device_name(device: int | None = None) -> str:
    name = (cuda.get_current_device() if device is None else cuda.gpus[device]).name
    return name.decode() if isinstance(name, bytes) else str(name)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _on_device(method: Callable[Concatenate[CudaBackend, _P], _R]) -> Callable[Concatenate[CudaBackend, _P], _R]:
    """Run ``method`` with the backend's context current in the calling thread.

    Streams, events, allocations, memsets, copies and memory readings all act on the current
    context: when another device's is current (a second manager's, or the user's), push ours
    for the call and pop it after. The common case, ours already current, costs one driver query.
    """

    @functools.wraps(method)
    def on_device(self: CudaBackend, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if int(binding.cuCtxGetCurrent()[1]) == self._handle:
            return method(self, *args, **kwargs)
        self._context.push()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._context.pop()

    return on_device


class CudaBackend(Backend):
    """A real GPU: one device's primary context, shared with the whole process.

    One CudaBackend per device: numba's memory manager class is process-global, so
    ``set_allocator`` also chooses it for contexts numba creates later; each device's context
    has its own manager and pool.

    Parameters
    ----------
    allocator : str
        One of :data:`ALLOCATORS`: which pool supplies device blocks. Anything but the current
        numba plugin costs a context reset.
    array_type : {"cupy", "numba"}, optional
        What ``device``, ``managed`` and ``mapped`` allocations are handed out as: ``cupy.ndarray``
        (None, the default) or numba ``DeviceNDArray``. ``pinned`` and ``host`` are numpy arrays.
    event_mechanism : {"thread", "host_func"}
        How events report completion (see :data:`EVENT_MECHANISMS`).
    device : int
        Which GPU, among those the process sees (``CUDA_VISIBLE_DEVICES`` renumbers them from 0).

    Raises
    ------
    BackendError
        If no CUDA context can be opened.
    ConfigurationError
        For an unknown array type, CuPy arrays without CuPy (naming the extra to install), or
        a device the process does not see (naming how many it sees).
    UnknownAllocatorError
        For an unknown allocator, or a CuPy one without CuPy.

    Notes
    -----
    ``free`` cannot force memory back: a block returns to its pool when the last array over
    it goes (numba's default manager batches those frees). ``memory_info`` therefore lags a
    ``free`` until references drop.
    """

    name = "cuda"

    def __init__(
        self,
        allocator: str = "default",
        *,
        array_type: str | None = None,
        event_mechanism: EventMechanism = "thread",
        device: int = 0,
    ) -> None:
        if event_mechanism not in EVENT_MECHANISMS:
            raise ValueError(f"unknown event mechanism {event_mechanism!r}: use one of {', '.join(EVENT_MECHANISMS)}")
        self.array_type = parse_array_type(array_type)
        self._cupy: Any = import_cupy(ConfigurationError) if self.array_type == "cupy" else None
        self.event_mechanism = event_mechanism
        self.granule = 2 << 20
        self._waiters: dict[int, StreamWaiter] = {}
        self._lock = threading.Lock()
        # One CuPy view per numba stream, kept while the stream lives, so that MemoryAsyncPool
        # frees each block on the stream that allocated it.
        self._cupy_streams: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._retired: list[Any] = []  # memory managers swapped out by set_allocator
        # Recorded events come back here when dropped (CudaEvent.__del__) and are recorded again.
        self._spare_events: list[Any] = []
        try:
            cuda.current_context()  # as numba's first use: the thread has a context (device 0's) current
            count = len(cuda.gpus)
            if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < count:
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                raise ConfigurationError(
                    f"no CUDA device {device!r}: this process sees {count} (ids 0 to {count - 1}"
                    f"{'' if visible is None else f', CUDA_VISIBLE_DEVICES={visible!r}'}); pass one of those"
                )
            # The primary context is never destroyed (see reset): look it up once, not per call.
            # numba's first lookup of another device's context leaves the thread with none
            # current (cuda.core sets it, numba pops it): put back the one that was.
            current = binding.cuCtxGetCurrent()[1]
            self._context = cuda.gpus[device].get_primary_context()
            if int(binding.cuCtxGetCurrent()[1]) != int(current):
                check(binding.cuCtxSetCurrent(current), "restoring the thread's CUDA context")
            self._handle = int(self._context.handle)
            self._device_id = self.device = device
            self.device_name = _device_name(device)
        except (CudaSupportError, CudaDriverError) as exc:
            raise BackendError(f"cannot open a CUDA context: {exc}") from exc
        if allocator in _pools.PLUGINS and type(self._context.memory_manager) is _pools.PLUGINS[allocator]:
            self.allocator = allocator
        else:
            self.set_allocator(allocator)

    # -- memory ------------------------------------------------------------------------------
    @_on_device
    def memory_info(self) -> MemoryInfo:
        with map_exceptions("reading device memory"):
            free, total = self._context.get_memory_info()
        return MemoryInfo(free=int(free), total=int(total))

    @_on_device
    def allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind, stream: Any) -> Any:
        if not isinstance(dtype, np.dtype):
            dtype = np.dtype(dtype)
        kind = MemoryKind(kind)
        if kind is MemoryKind.DEVICE and self.allocator == "cupy" and self._cupy is not None:
            # the request path's common case: a CuPy array straight over a MemoryPool block (the
            # pool of the plugin installed now: numba's memory manager is process-wide)
            pool = getattr(self._context.memory_manager, "pool", None)
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes and pool is not None and not self._cupy_async_pool(pool):
                with map_exceptions(
                    lambda: f"allocating {nbytes} bytes ({shape}, {dtype}, device) with the cupy allocator",
                    self._free_text,
                ):
                    return self._cupy.ndarray(shape, dtype, memptr=pool.malloc(nbytes))
        if kind is MemoryKind.HOST:
            return np.empty(shape, dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if kind is MemoryKind.PINNED:
            return self._pinned(shape, dtype, nbytes)
        if kind is MemoryKind.MANAGED:
            self._refuse_managed_beyond_free(nbytes, shape, dtype)
        context = self._context
        with map_exceptions(
            lambda: f"allocating {nbytes} bytes ({shape}, {dtype}, {kind.value}) with the {self.allocator} allocator",
            self._free_text,
        ):
            if not nbytes:
                block = None
            elif kind is MemoryKind.DEVICE:
                if self.allocator == "cupy_async":
                    with self._ordered_on(stream):
                        block = _pools.device_block(context, nbytes)
                else:
                    block = _pools.device_block(context, nbytes)
            elif kind is MemoryKind.MANAGED:
                block = _pools.managed_block(context, nbytes)
            else:  # mapped: page-locked host memory, used through its device address
                memory = _pools.host_block(context, nbytes, mapped=True)
                block = _pools.Block(memory.device_pointer_value or 0, nbytes, memory)
            if self._cupy is not None:
                return _arrays.cupy_array(self._cupy, shape, dtype, block, self._device_id)
            return _arrays.numba_array(shape, dtype, block, stream, context)

    def _pinned(self, shape: tuple[int, ...], dtype: np.dtype[Any], nbytes: int) -> np.ndarray[Any, Any]:
        if not nbytes:
            return np.empty(shape, dtype)
        with map_exceptions(f"allocating {nbytes} bytes of pinned host memory ({shape}, {dtype})"):
            memory = _pools.host_block(self._context, nbytes, mapped=False)
        return np.ndarray(shape, dtype, buffer=memory)  # numpy keeps the page-locked buffer alive

    def _refuse_managed_beyond_free(self, nbytes: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        # Oversubscribing managed memory can hang the GPU: refuse before the driver sees it,
        # keeping a granule spare for whatever else allocates meanwhile.
        free, total = self._driver_memory()
        if nbytes + self.granule > free:
            self._release_slack()  # blocks a pool keeps are device memory managed arrays could use
            free, total = self._driver_memory()
        if nbytes + self.granule > free:
            raise AllocationError(
                f"refusing {nbytes} bytes of managed memory ({shape}, {dtype}): only {free} of "
                f"{total} bytes are free on {self.device_name}, less a {self.granule}-byte margin"
            )

    def pool_facts(self) -> PoolFacts:
        """The CuPy pool's bytes (``total_bytes``, ``used_bytes``); None for numba's default manager.

        Neither CuPy pool says how large its largest cached block is: ``largest_free`` is None.
        """
        pool = getattr(self._context.memory_manager, "pool", None)
        total, used = getattr(pool, "total_bytes", None), getattr(pool, "used_bytes", None)
        if total is None or used is None:
            return PoolFacts()
        with map_exceptions("reading the pool's bytes"):
            return PoolFacts(held=int(total()), in_use=int(used()))

    def release_cached(self) -> int:
        """Run numba's deferred frees and empty the pools' caches; the bytes the device got back."""
        before, _ = self._driver_memory()
        self._release_slack()
        after, _ = self._driver_memory()
        return max(0, after - before)

    def _driver_memory(self) -> tuple[int, int]:
        with map_exceptions("reading device memory"):
            free, total = nbdriver.driver.cuMemGetInfo()
        return int(free), int(total)

    def _free_text(self) -> str:
        free, total = self._driver_memory()
        info = self.memory_info()
        return f"{free} of {total} bytes free on {self.device_name}, {info.free} counting pool slack"

    def _ordered_on(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Bind ``stream`` as CuPy's current stream, for the stream-ordered pool."""
        if not isinstance(stream, nbdriver.Stream):
            return import_cupy().cuda.Stream.null  # type: ignore[no-any-return]
        cupy_stream = self._cupy_streams.get(stream)
        if cupy_stream is None:
            cupy_stream = self._cupy_streams[stream] = cupy_view(import_cupy(), stream)
        return cupy_stream  # type: ignore[no-any-return]

    @_on_device
    def zero(self, array: Any, stream: Any) -> None:
        """Queue a memset on ``stream`` for device-side arrays; fill host arrays now.

        Host arrays (host, pinned) come straight from ``allocate`` with no work queued on them.
        """
        ptr = _arrays.device_pointer(array)
        if ptr is None:
            np.asarray(array).fill(0)
        elif array.nbytes:
            check(
                binding.cuMemsetD8Async(ptr, 0, int(array.nbytes), binding.CUstream(stream_ptr(stream))),
                f"zeroing {array.nbytes} bytes",
            )

    def free(self, array: Any) -> None:
        """Forget ``array``; the backend holds no reference, so the caller's drop frees it."""

    def nbytes(self, array: Any) -> int:
        return int(array.nbytes)

    @_on_device
    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        kind = MemoryKind(kind)
        if kind is MemoryKind.HOST:
            return np.zeros(shape, dtype)
        if kind is not MemoryKind.PINNED:
            raise InvalidRequestError(f"host arrays are 'pinned' or 'host', not {kind.value!r}")
        dtype = np.dtype(dtype)
        array = self._pinned(shape, dtype, math.prod(shape) * dtype.itemsize)
        array.fill(0)
        return array

    # -- streams, events, copies -------------------------------------------------------------
    @_on_device
    def create_stream(self) -> Any:
        with map_exceptions("creating a stream"):
            return self._context.create_stream()

    def _cupy_async_pool(self, pool: Any) -> bool:
        # MemoryAsyncPool allocates on CuPy's current stream: the general path binds the group's
        return isinstance(pool, self._cupy.cuda.MemoryAsyncPool)

    @_on_device
    def record_event(self, stream: Any) -> CudaEvent:
        spare = self._spare_events
        if spare:
            handle = spare.pop()
        else:
            err, handle = binding.cuEventCreate(EVENT_FLAGS)
            check((err,), "cuEventCreate")
        event = CudaEvent(handle, stream, self)  # returns the handle to the spares when dropped
        result = binding.cuEventRecord(handle, stream_ptr(stream))
        if result[0] != binding.CUresult.CUDA_SUCCESS:
            check(result, f"recording an event on {stream!r}")
        return event

    def _waiter(self, stream: Any) -> StreamWaiter:
        key = stream_ptr(stream)
        with self._lock:
            waiter = self._waiters.get(key)
            if waiter is None:
                context = binding.CUcontext(self._handle)
                waiter = self._waiters[key] = StreamWaiter(context, f"aiocubie-events-{key:#x}")
            return waiter

    @_on_device
    def wait_event(self, stream: Any, event: Any) -> None:
        """``cuStreamWaitEvent``: ``stream`` waits on the GPU, the host does not."""
        result = binding.cuStreamWaitEvent(binding.CUstream(stream_ptr(stream)), event.handle, 0)
        if result[0] != binding.CUresult.CUDA_SUCCESS:
            check(result, f"making {stream!r} wait for an event")

    def is_pinned(self, array: Any) -> bool:
        """Whether the driver knows ``array``'s memory as page-locked host memory."""
        if not isinstance(array, np.ndarray) or not array.nbytes:
            return False
        err, kind = binding.cuPointerGetAttribute(_MEMORY_TYPE, array.ctypes.data)
        return err == binding.CUresult.CUDA_SUCCESS and int(kind) == int(binding.CUmemorytype.CU_MEMORYTYPE_HOST)

    @_on_device
    def copy(self, src: Any, dst: Any, stream: Any, *, tag: object = None) -> None:
        """Queue one ``cuMemcpyAsync``; unified addressing tells the direction.

        That covers every kind and array type on either side. A pageable host side makes the
        copy synchronous, as CUDA does.
        """
        if getattr(src, "shape", None) != getattr(dst, "shape", None) or src.dtype != dst.dtype:
            raise BackendError(
                f"cannot copy {getattr(src, 'shape', '?')} {getattr(src, 'dtype', '?')} into "
                f"{getattr(dst, 'shape', '?')} {getattr(dst, 'dtype', '?')}: shapes and dtypes must match"
            )
        nbytes = int(src.nbytes)
        if nbytes:
            (src_ptr, src_c), (dst_ptr, dst_c) = (
                _arrays.pointer_and_contiguity(src),
                _arrays.pointer_and_contiguity(dst),
            )
            if not (src_c and dst_c):
                raise BackendError("copies need C-contiguous arrays")
            check(
                binding.cuMemcpyAsync(dst_ptr, src_ptr, nbytes, binding.CUstream(stream_ptr(stream))),
                f"copying {nbytes} bytes",
            )

    @_on_device
    def _launch_host_func(self, stream: Any, function: Any, key: int) -> None:
        result = binding.cuLaunchHostFunc(binding.CUstream(stream_ptr(stream)), function, key)
        if result[0] != binding.CUresult.CUDA_SUCCESS:
            check(result, "cuLaunchHostFunc")

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Make this GPU current in the calling thread: numba's context and CuPy's device."""
        self._context.push()
        try:
            with contextlib.nullcontext() if self._cupy is None else self._cupy.cuda.Device(self._device_id):
                yield
        finally:
            self._context.pop()

    # -- managed memory ----------------------------------------------------------------------
    @_on_device
    def prefetch(self, array: Any, device: int | None, stream: Any) -> None:
        ptr, size = self._managed_extent(array)
        fn = getattr(binding, "cuMemPrefetchAsync_v2", None)  # CUDA 12.2+; CUDA 13 renamed it back
        if fn is None:
            fn = binding.cuMemPrefetchAsync
        check(fn(ptr, size, _location(device), 0, binding.CUstream(stream_ptr(stream))), "cuMemPrefetchAsync")

    @_on_device
    def advise(self, array: Any, advice: Advice, device: int | None) -> None:
        if advice not in _ADVICE:
            raise BackendError(f"unknown managed-memory advice {advice!r}: use one of {', '.join(_ADVICE)}")
        ptr, size = self._managed_extent(array)
        fn = getattr(binding, "cuMemAdvise_v2", None) or binding.cuMemAdvise  # as for prefetch
        check(fn(ptr, size, _ADVICE[advice], _location(device)), f"cuMemAdvise({advice})")

    @staticmethod
    def _managed_extent(array: Any) -> tuple[Any, int]:
        ptr = _arrays.device_pointer(array)
        managed = False
        if ptr:
            err, value = binding.cuPointerGetAttribute(_IS_MANAGED, ptr)
            managed = err == binding.CUresult.CUDA_SUCCESS and bool(value)
        if not managed:
            raise BackendError(f"prefetch and advice need a managed array, got a {type(array).__name__} that is not")
        return binding.CUdeviceptr(ptr), int(array.nbytes)

    # -- context -----------------------------------------------------------------------------
    @_on_device
    def set_allocator(self, name: str) -> None:
        """Swap numba's memory manager for ``name``'s, on the live context (see :meth:`reset`)."""
        if name not in ALLOCATORS:
            raise UnknownAllocatorError(f"unknown allocator {name!r}: use one of {', '.join(ALLOCATORS)}")
        if name != "default":
            import_cupy()
        self._quiesce()
        plugin = _pools.PLUGINS[name]
        nbdriver.set_memory_manager(plugin)  # for any context numba creates later
        context = self._context
        if type(context.memory_manager) is not plugin:
            manager = plugin(context=context)
            manager.initialize()
            # The retired manager still owns the memory of arrays handed out before; it frees
            # them as they are dropped, and reset/close flush its deferred frees.
            self._retired.append(context.memory_manager)
            context.memory_manager = manager
        self._release_slack()
        self.allocator = name

    @_on_device
    def reset(self) -> None:
        """Wait for queued work, run pending callbacks, then return deferred frees and pool slack.

        The primary context is not destroyed: numba-cuda 0.30 cannot reopen one in-process
        (cuda.core keeps a retained handle to the destroyed context, and every later call fails
        with CUDA_ERROR_CONTEXT_IS_DESTROYED). Arrays and streams handed out before therefore
        stay usable in fact; callers must still treat them as invalid, as the protocol says.
        """
        self._quiesce()
        self._release_slack()

    @_on_device
    def close(self) -> None:
        self.reset()
        spares, self._spare_events = self._spare_events, []
        for handle in spares:
            binding.cuEventDestroy(handle)

    def _quiesce(self) -> None:
        """Let queued work finish and every pending callback run, then stop the helper threads."""
        try:
            self._context.synchronize()
        except CudaDriverError:
            log.exception("aiocubie: synchronizing the device failed; going on")
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.stop()
        self._cupy_streams.clear()

    def _release_slack(self) -> None:
        for manager in [*self._retired, self._context.memory_manager]:
            manager.deallocations.clear()  # numba defers frees of dropped arrays: run them now
            if getattr(manager, "pool", None) is not None:
                manager.pool.free_all_blocks()
        if self._cupy is not None:
            self._cupy.get_default_memory_pool().free_all_blocks()  # CuPy's own, for its temporaries


def _location(device: int | None) -> Any:
    location = binding.CUmemLocation()
    if device is None:
        location.type = binding.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
    else:
        location.type = binding.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = device
    return location
