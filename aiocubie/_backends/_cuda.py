"""The CUDA backend: numba-cuda arrays, streams and events, with CuPy pool allocator plugins.

It must never ask for more managed memory than the device has free, never destroy the shared
primary context, never import CuPy before a CuPy allocator or helper is used, and never let a
numba or CuPy error escape untranslated from an allocation.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import logging
import math
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

import numpy as np
from cuda.bindings import driver as binding
from numba import cuda
from numba.cuda.cudadrv import driver as nbdriver
from numba.cuda.cudadrv.devicearray import DeviceNDArrayBase, ManagedNDArray, MappedNDArray
from numba.cuda.cudadrv.error import CudaDriverError, CudaSupportError

from .._errors import AllocationError, BackendError, InvalidRequestError, UnknownAllocatorError
from .._requests import MemoryKind
from ._base import ALLOCATORS, Advice, Backend, Event, MemoryInfo

__all__ = ["EVENT_MECHANISMS", "CudaBackend", "CudaEvent", "cuda_usable", "current_cupy_stream"]

log = logging.getLogger("aiocubie")

#: How :meth:`CudaEvent.add_done_callback` learns that the GPU reached the event:
#: ``"thread"`` (the default), a helper thread per stream blocked in ``cuEventSynchronize``
#: (blocking-sync events, so it sleeps instead of spinning); ``"host_func"``, a
#: ``cuLaunchHostFunc`` queued right after the event. benchmarks/NOTES-gpu.md has the
#: measurements behind the default: "thread" had the lower median and p99 in every case.
EVENT_MECHANISMS = ("thread", "host_func")
EventMechanism = Literal["thread", "host_func"]

# Blocking sync makes cuEventSynchronize sleep in the kernel rather than spin a core; no timing
# makes recording cheaper.
_EVENT_FLAGS = int(binding.CUevent_flags.CU_EVENT_BLOCKING_SYNC) | int(binding.CUevent_flags.CU_EVENT_DISABLE_TIMING)
_OOM = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
_CUDA_RT_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation, as CuPy's CUDARuntimeError.status
_ADVICE = {
    "preferred_location": binding.CUmem_advise.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
    "accessed_by": binding.CUmem_advise.CU_MEM_ADVISE_SET_ACCESSED_BY,
    "read_mostly": binding.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY,
}
_CUPY_HINT = "install CuPy with the extra that matches your CUDA: pip install 'aiocubie[cuda12]' or 'aiocubie[cuda13]'"


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


def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise UnknownAllocatorError(f"CuPy is not importable ({exc}): {_CUPY_HINT}") from exc
    return cupy


def _stream_ptr(stream: Any) -> int:
    """The raw CUstream of a numba stream, or 0 for the default stream."""
    return int(stream.handle) if isinstance(stream, nbdriver.Stream) else int(stream)


class _StreamPointer:
    """A bare CUDA-stream-protocol object: lets CuPy view a stream without keeping it alive."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _cupy_view(cupy: Any, stream: Any) -> Any:
    """A CuPy stream for a numba stream (or 0); it does not own the stream."""
    ptr = _stream_ptr(stream)
    if not ptr:
        return cupy.cuda.Stream.null
    from_external = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy 14 deprecates ExternalStream
    return from_external(_StreamPointer(ptr)) if from_external else cupy.cuda.ExternalStream(ptr)


@contextlib.contextmanager
def current_cupy_stream(stream: Any) -> Iterator[Any]:
    """Make a numba stream CuPy's current stream for the block.

    CuPy work in the block (kernels, copies, ``MemoryAsyncPool`` allocations) is then ordered
    on ``stream``.

    Parameters
    ----------
    stream : numba.cuda.cudadrv.driver.Stream or 0
        The stream to bind; 0 binds the default stream.

    Yields
    ------
    cupy.cuda.Stream
        The CuPy view of ``stream``; it does not own the stream.
    """
    with _cupy_view(_import_cupy(), stream) as cupy_stream:
        yield cupy_stream


# -- allocator plugins -----------------------------------------------------------------------


def _hold(block: Any) -> None:
    """A numba finalizer that only holds ``block``: once numba drops it, CuPy gets it back."""


class _CupyPoolManager(nbdriver.GetIpcHandleMixin, nbdriver.HostOnlyCUDAMemoryManager):  # type: ignore[misc]
    """Numba EMM plugin: device memory from a ``cupy.cuda.MemoryPool`` (one per context)."""

    stream_ordered: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool: Any = None

    def initialize(self) -> None:
        # numba calls this on every context lookup, so on every allocation: build the pool once
        if self.pool is None:
            cupy = _import_cupy()
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


class _CupyAsyncPoolManager(_CupyPoolManager):
    """Numba EMM plugin: stream-ordered device memory (cudaMallocAsync) from ``cupy.cuda.MemoryAsyncPool``."""

    stream_ordered = True


_PLUGINS: dict[str, type[Any]] = {
    "default": nbdriver.NumbaCUDAMemoryManager,
    "cupy": _CupyPoolManager,
    "cupy_async": _CupyAsyncPoolManager,
}


# -- events and completion callbacks ---------------------------------------------------------


def _check(result: tuple[Any, ...], what: str) -> None:
    if result[0] != binding.CUresult.CUDA_SUCCESS:
        raise BackendError(f"{what} failed: {result[0].name}")


class _StreamWaiter:
    """A daemon thread that waits, in order, on the events of one stream and runs their callbacks.

    Events of one stream complete in the order they were recorded, so a FIFO per stream never
    holds a completed event behind a pending one of another stream.
    """

    def __init__(self, context: Any, name: str) -> None:
        self._context = context
        self._queue: queue.SimpleQueue[tuple[Any, Callable[[], None]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, event: Any, callback: Callable[[], None]) -> None:
        """Run ``callback`` once ``event`` (anything with a CUevent ``handle``) completes."""
        self._queue.put((event, callback))

    def stop(self) -> None:
        """Finish the queued waits (their events must be able to complete), then end the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        # Raw driver calls only: numba's per-thread context cache would go stale at a reset.
        binding.cuCtxSetCurrent(self._context)
        while (item := self._queue.get()) is not None:
            event, callback = item
            # cuEventSynchronize releases the GIL. On a device error the callback still runs:
            # the waiter wakes, and event.query() raises the error.
            binding.cuEventSynchronize(event.handle)
            _run_callback(callback)


def _run_callback(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # a callback's bug must not kill a driver or helper thread
        log.exception("aiocubie: an event callback raised")


_HOST_FN_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_host_callbacks: dict[int, Callable[[], None]] = {}
_host_keys = itertools.count(1)  # 0 would arrive as None


@_HOST_FN_TYPE
def _host_fn(key: int) -> None:
    # Runs on a CUDA driver thread; ctypes takes the GIL for us. dict.pop is atomic under the GIL.
    _run_callback(_host_callbacks.pop(key))


_HOST_FN = binding.CUhostFn(ctypes.cast(_host_fn, ctypes.c_void_p).value)


class CudaEvent(Event):
    """A blocking-sync CUDA event recorded on a stream.

    Parameters
    ----------
    handle : cuda.bindings.driver.CUevent
        The recorded event; destroyed when this object is collected.
    stream : numba stream or 0
        The stream it was recorded on.
    backend : CudaBackend
        Supplies the completion mechanism.
    """

    def __init__(self, handle: Any, stream: Any, backend: CudaBackend) -> None:
        self.handle = handle
        self.stream = stream
        self._backend = backend
        # The raw binding returns an error code instead of raising, so this is safe after a reset.
        weakref.finalize(self, binding.cuEventDestroy, handle)

    def query(self) -> bool:
        (err,) = binding.cuEventQuery(self.handle)
        if err == binding.CUresult.CUDA_ERROR_NOT_READY:
            return False
        _check((err,), "cuEventQuery")
        return True

    def synchronize(self) -> None:
        _check(binding.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the GPU reaches the event, from a helper or driver thread.

        Runs it at once on the calling thread if the event is already complete. With the
        ``"host_func"`` mechanism, work queued on the stream after the event and before this
        call delays the callback, and the stream waits for the callback (and the GIL) to return.
        """
        if self.query():
            callback()
        elif self._backend.event_mechanism == "thread":
            self._backend._waiter(self.stream).submit(self, callback)
        else:
            key = next(_host_keys)
            _host_callbacks[key] = callback
            result = binding.cuLaunchHostFunc(binding.CUstream(_stream_ptr(self.stream)), _HOST_FN, key)
            if result[0] != binding.CUresult.CUDA_SUCCESS:
                del _host_callbacks[key]
                _check(result, "cuLaunchHostFunc")


# -- the backend -----------------------------------------------------------------------------


def _is_oom(exc: BaseException) -> bool:
    return (
        isinstance(exc, MemoryError)  # numpy, and CuPy's OutOfMemoryError
        or (isinstance(exc, nbdriver.CudaAPIError) and exc.code == _OOM)
        or getattr(exc, "status", None) == _CUDA_RT_ERROR_MEMORY_ALLOCATION  # CuPy's CUDARuntimeError
    )


def _is_device_error(exc: BaseException) -> bool:
    return isinstance(exc, CudaDriverError) or type(exc).__module__.startswith(("cupy", "cupy_backends"))


def _device_name() -> str:
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


class CudaBackend(Backend):
    """A real GPU through numba-cuda: device 0's primary context, shared with the whole process.

    numba's memory manager is process-global, so use one CudaBackend per process:
    ``set_allocator`` swaps it for every user of numba.cuda in the process.

    Parameters
    ----------
    allocator : str
        One of :data:`ALLOCATORS`; anything but the current numba plugin costs a context reset.
    event_mechanism : {"thread", "host_func"}
        How events report completion (see :data:`EVENT_MECHANISMS`).

    Raises
    ------
    BackendError
        If no CUDA context can be opened.
    UnknownAllocatorError
        For an unknown allocator, or a CuPy one without CuPy.

    Notes
    -----
    ``free`` cannot force memory back: numba releases an array when its last reference goes
    (the default allocator batches those frees; the CuPy pools keep the blocks for reuse and
    report them as free). ``memory_info`` therefore lags a ``free`` until references drop.
    """

    name = "cuda"

    def __init__(self, allocator: str = "default", *, event_mechanism: EventMechanism = "thread") -> None:
        if event_mechanism not in EVENT_MECHANISMS:
            raise ValueError(f"unknown event mechanism {event_mechanism!r}: use one of {', '.join(EVENT_MECHANISMS)}")
        self.event_mechanism = event_mechanism
        self.granule = 2 << 20
        self._waiters: dict[int, _StreamWaiter] = {}
        self._lock = threading.Lock()
        # One CuPy view per numba stream, kept while the stream lives, so that MemoryAsyncPool
        # frees each block on the stream that allocated it.
        self._cupy_streams: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._retired: list[Any] = []  # memory managers swapped out by set_allocator
        try:
            context = cuda.current_context()
            self.device_name = _device_name()
        except (CudaSupportError, CudaDriverError) as exc:
            raise BackendError(f"cannot open a CUDA context: {exc}") from exc
        if allocator in _PLUGINS and type(context.memory_manager) is _PLUGINS[allocator]:
            self.allocator = allocator
        else:
            self.set_allocator(allocator)

    # -- memory ------------------------------------------------------------------------------
    def memory_info(self) -> MemoryInfo:
        try:
            free, total = cuda.current_context().get_memory_info()
        except CudaDriverError as exc:
            raise BackendError(f"cannot read device memory: {exc}") from exc
        return MemoryInfo(free=int(free), total=int(total))

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind, stream: Any) -> Any:
        dtype = np.dtype(dtype)
        kind = MemoryKind(kind)
        nbytes = math.prod(shape) * dtype.itemsize
        if kind is MemoryKind.MANAGED:
            self._refuse_managed_beyond_free(nbytes, shape, dtype)
        try:
            if kind is MemoryKind.HOST:
                return np.empty(shape, dtype)
            if kind is MemoryKind.PINNED:
                return cuda.pinned_array(shape, dtype)
            if kind is MemoryKind.MAPPED:
                return cuda.mapped_array(shape, dtype, stream=stream)
            if kind is MemoryKind.MANAGED:
                return cuda.managed_array(shape, dtype, stream=stream)
            with self._ordered_on(stream):
                return cuda.device_array(shape, dtype, stream=stream)
        except Exception as exc:
            what = f"{nbytes} bytes ({shape}, {dtype}, {kind.value})"
            if _is_oom(exc):
                raise AllocationError(
                    f"out of memory allocating {what} with the {self.allocator} allocator on "
                    f"{self.device_name}: {self._free_text()}"
                ) from exc
            if _is_device_error(exc):
                raise BackendError(f"allocating {what} failed: {exc}") from exc
            raise

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

    def _driver_memory(self) -> tuple[int, int]:
        try:
            free, total = nbdriver.driver.cuMemGetInfo()
        except CudaDriverError as exc:
            raise BackendError(f"cannot read device memory: {exc}") from exc
        return int(free), int(total)

    def _free_text(self) -> str:
        free, total = self._driver_memory()
        info = self.memory_info()
        return f"{free} of {total} bytes free on the device, {info.free} counting pool slack"

    def _ordered_on(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Bind ``stream`` as CuPy's current stream where the allocator orders allocations on it."""
        if self.allocator != "cupy_async":
            return contextlib.nullcontext()
        if not isinstance(stream, nbdriver.Stream):
            return _import_cupy().cuda.Stream.null  # type: ignore[no-any-return]
        cupy_stream = self._cupy_streams.get(stream)
        if cupy_stream is None:
            cupy_stream = self._cupy_streams[stream] = _cupy_view(_import_cupy(), stream)
        return cupy_stream  # type: ignore[no-any-return]

    def zero(self, array: Any, stream: Any) -> None:
        """Queue a memset on ``stream`` for device and managed arrays; fill host kinds now.

        Host kinds (host, pinned, mapped) are filled on the calling thread: they come straight
        from ``allocate`` with no work queued on them yet.
        """
        if isinstance(array, DeviceNDArrayBase) and not isinstance(array, MappedNDArray):
            if array.nbytes:
                try:
                    nbdriver.device_memset(array, 0, array.nbytes, stream)
                except CudaDriverError as exc:
                    raise BackendError(f"zeroing {array.nbytes} bytes failed: {exc}") from exc
        else:
            np.asarray(array).fill(0)

    def free(self, array: Any) -> None:
        """Forget ``array``; the backend holds no reference, so the caller's drop frees it."""

    def nbytes(self, array: Any) -> int:
        return int(array.nbytes)

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        kind = MemoryKind(kind)
        if kind is MemoryKind.HOST:
            return np.zeros(shape, dtype)
        if kind is not MemoryKind.PINNED:
            raise InvalidRequestError(f"host arrays are 'pinned' or 'host', not {kind.value!r}")
        try:
            array: np.ndarray[Any, Any] = cuda.pinned_array(shape, dtype)
        except Exception as exc:
            if _is_oom(exc):
                raise AllocationError(f"out of pinned host memory for {shape} {np.dtype(dtype)}") from exc
            raise
        array.fill(0)
        return array

    # -- streams, events, copies -------------------------------------------------------------
    def create_stream(self) -> Any:
        try:
            return cuda.stream()
        except CudaDriverError as exc:
            raise BackendError(f"cannot create a stream: {exc}") from exc

    def record_event(self, stream: Any) -> CudaEvent:
        try:
            event = CudaEvent(nbdriver.driver.cuEventCreate(_EVENT_FLAGS), stream, self)
            nbdriver.driver.cuEventRecord(event.handle, _stream_ptr(stream))
        except CudaDriverError as exc:
            raise BackendError(f"cannot record an event on {stream!r}: {exc}") from exc
        return event

    def _waiter(self, stream: Any) -> _StreamWaiter:
        key = _stream_ptr(stream)
        with self._lock:
            waiter = self._waiters.get(key)
            if waiter is None:
                context = binding.cuCtxGetCurrent()[1]
                waiter = self._waiters[key] = _StreamWaiter(context, f"aiocubie-events-{key:#x}")
            return waiter

    def copy(self, src: Any, dst: Any, stream: Any) -> None:
        """Queue one ``cuMemcpyAsync``; unified addressing tells the direction.

        That covers every kind on either side (numba's own copy methods fail on managed arrays).
        A pageable host side makes the copy synchronous, as CUDA does.
        """
        if getattr(src, "shape", None) != getattr(dst, "shape", None) or src.dtype != dst.dtype:
            raise BackendError(
                f"cannot copy {getattr(src, 'shape', '?')} {getattr(src, 'dtype', '?')} into "
                f"{getattr(dst, 'shape', '?')} {getattr(dst, 'dtype', '?')}: shapes and dtypes must match"
            )
        nbytes = int(src.nbytes)
        if nbytes:
            result = binding.cuMemcpyAsync(_address(dst), _address(src), nbytes, binding.CUstream(_stream_ptr(stream)))
            _check(result, f"copying {nbytes} bytes")

    # -- managed memory ----------------------------------------------------------------------
    def prefetch(self, array: Any, device: int | None, stream: Any) -> None:
        ptr, size = self._managed_extent(array)
        fn = getattr(binding, "cuMemPrefetchAsync_v2", None)  # CUDA 12.2+; CUDA 13 renamed it back
        if fn is None:
            fn = binding.cuMemPrefetchAsync
        _check(fn(ptr, size, _location(device), 0, binding.CUstream(_stream_ptr(stream))), "cuMemPrefetchAsync")

    def advise(self, array: Any, advice: Advice, device: int | None) -> None:
        if advice not in _ADVICE:
            raise BackendError(f"unknown managed-memory advice {advice!r}: use one of {', '.join(_ADVICE)}")
        ptr, size = self._managed_extent(array)
        fn = getattr(binding, "cuMemAdvise_v2", None) or binding.cuMemAdvise  # as for prefetch
        _check(fn(ptr, size, _ADVICE[advice], _location(device)), f"cuMemAdvise({advice})")

    @staticmethod
    def _managed_extent(array: Any) -> tuple[Any, int]:
        if not isinstance(array, ManagedNDArray):
            raise BackendError(f"prefetch and advice need a managed array, got {type(array).__name__}")
        return binding.CUdeviceptr(array.__cuda_array_interface__["data"][0]), int(array.nbytes)

    # -- context -----------------------------------------------------------------------------
    def set_allocator(self, name: str) -> None:
        """Swap numba's memory manager for ``name``'s, on the live context (see :meth:`reset`)."""
        if name not in ALLOCATORS:
            raise UnknownAllocatorError(f"unknown allocator {name!r}: use one of {', '.join(ALLOCATORS)}")
        if name != "default":
            _import_cupy()
        self._quiesce()
        plugin = _PLUGINS[name]
        nbdriver.set_memory_manager(plugin)  # for any context numba creates later
        context = cuda.current_context()
        if type(context.memory_manager) is not plugin:
            manager = plugin(context=context)
            manager.initialize()
            # The retired manager still owns the memory of arrays handed out before; it frees
            # them as they are dropped, and reset/close flush its deferred frees.
            self._retired.append(context.memory_manager)
            context.memory_manager = manager
        self._release_slack()
        self.allocator = name

    def reset(self) -> None:
        """Wait for queued work, run pending callbacks, then return deferred frees and pool slack.

        The primary context is not destroyed: numba-cuda 0.30 cannot reopen one in-process
        (cuda.core keeps a retained handle to the destroyed context, and every later call fails
        with CUDA_ERROR_CONTEXT_IS_DESTROYED). Arrays and streams handed out before therefore
        stay usable in fact; callers must still treat them as invalid, as the protocol says.
        """
        self._quiesce()
        self._release_slack()

    def close(self) -> None:
        self.reset()

    def _quiesce(self) -> None:
        """Let queued work finish and every pending callback run, then stop the helper threads."""
        try:
            cuda.synchronize()
        except CudaDriverError:
            log.exception("aiocubie: synchronizing the device failed; going on")
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.stop()
        self._cupy_streams.clear()

    def _release_slack(self) -> None:
        for manager in [*self._retired, cuda.current_context().memory_manager]:
            manager.deallocations.clear()  # numba defers frees of dropped arrays: run them now
            if getattr(manager, "pool", None) is not None:
                manager.pool.free_all_blocks()


def _address(array: Any) -> int:
    """The address of a C-contiguous array of any kind (device pointer, or host pointer under UVA)."""
    if isinstance(array, DeviceNDArrayBase):
        interface = array.__cuda_array_interface__
        contiguous = interface["strides"] is None or array.is_c_contiguous()
        address = interface["data"][0]
    else:
        array = np.asarray(array)
        contiguous, address = array.flags.c_contiguous, array.ctypes.data
    if not contiguous:
        raise BackendError("copies need C-contiguous arrays")
    return int(address)


def _location(device: int | None) -> Any:
    location = binding.CUmemLocation()
    if device is None:
        location.type = binding.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
    else:
        location.type = binding.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        location.id = device
    return location
