"""The CUDA device on cuda.core: streams, events, copies, fills, memory readings, managed memory.

Activation: stream-ordered work (copies, fills, event records and waits, pool allocations)
names its stream, and the driver runs it in the stream's context whatever is current, so the
hot path makes nothing current. Only what acts on the *current* context (creating streams and
events, reading free memory, CuPy's pools, host and managed allocations) calls
:meth:`CudaDevice.make_current`: one driver query (about 0.5 us) when this device already is
current, a ``set_current`` when another is (two managers on two devices in one thread). The
device stays current afterwards: nothing is pushed and popped around calls. It never destroys
the primary context (shared with CuPy, numba and the user) and never imports numba.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from cuda.bindings import driver as binding
from cuda.core import Device as CoreDevice
from cuda.core import Host, ManagedBuffer, Stream, StreamOptions

from ..._errors import AllocationError, BackendError, ConfigurationError, InvalidRequestError, UnknownAllocatorError
from ..._names import MemoryKind
from .._allocators import find_factory, register_allocator, registered
from .._device import Advice, Copier, Device, MemoryInfo
from .._resource import Block, MemoryResource
from .._strided import Geometry, geometry, refusal
from .._waiter import StreamWaiter
from ._arrays import device_pointer, host_address, host_array, pointer_and_contiguity, pointer_and_strides
from ._errors import check, map_exceptions, translate
from ._events import EVENT_OPTIONS, CudaEvent
from ._resources import CupyAsyncResource, CupyResource, DriverResource, HostAllocation
from ._streams import as_stream, stream_handle

__all__ = ["DEFAULT_RESOURCE", "CudaDevice", "cuda_usable", "driver_device_count"]

#: The resource ``allocator="default"`` names on a GPU: the device's stream-ordered pool
#: (docs/choosing-an-allocator.md and docs/performance.md have the measurements behind the choice).
DEFAULT_RESOURCE = "driver"

_MEMORY_TYPE = binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
_IS_MANAGED = binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED
_HOST_MEMORY = int(binding.CUmemorytype.CU_MEMORYTYPE_HOST)
_SUCCESS = binding.CUresult.CUDA_SUCCESS
# Blocking streams, as numba's and CuPy's own: work on the legacy default stream (CuPy's and
# numba's default for copies) stays ordered with the groups' streams.
_STREAM_OPTIONS = StreamOptions(nonblocking=False)
_HOST_ALLOC_PINNED = binding.CU_MEMHOSTALLOC_PORTABLE
# A numpy side of a strided copy is host memory (pinned or not: the driver knows which);
# any other side is an address of the unified space (device, managed, mapped).
_HOST_SIDE = binding.CUmemorytype.CU_MEMORYTYPE_HOST
_UNIFIED_SIDE = binding.CUmemorytype.CU_MEMORYTYPE_UNIFIED
_MAX_PITCH = binding.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_PITCH

#: (host address, bytes) -> whether the driver knows that memory as page-locked (see _pinned_at).
_pinned: dict[tuple[int, int], bool] = {}
_MAX_PINNED = 4096


def _pinned_at(address: int, nbytes: int) -> bool:
    """Whether the driver knows the host memory at ``address`` as page-locked.

    The answer is remembered by address and size (a batch stream asks about the same host
    buffers again and again). One remembered for memory freed and mapped again at the same place
    can be wrong; that only makes a copy synchronous, as for any pageable memory.
    """
    key = (address, nbytes)
    pinned = _pinned.get(key)
    if pinned is None:
        err, kind = binding.cuPointerGetAttribute(_MEMORY_TYPE, address)
        pinned = err == _SUCCESS and int(kind) == _HOST_MEMORY
        if len(_pinned) >= _MAX_PINNED:
            _pinned.clear()
        _pinned[key] = pinned
    return pinned


def driver_device_count() -> tuple[int, str]:
    """How many GPUs the driver shows this process, and a sentence saying so (or why none)."""
    try:
        (err,) = binding.cuInit(0)
        if err != _SUCCESS:
            return 0, f"the CUDA driver failed to initialise ({err.name})"
        err, count = binding.cuDeviceGetCount()
    except Exception as exc:  # no libcuda: cuda.bindings raises when it cannot load the driver
        return 0, f"no usable CUDA driver ({exc})"
    if err != _SUCCESS or not count:
        return 0, f"the CUDA driver sees no device ({getattr(err, 'name', err)})"
    return int(count), f"{count} CUDA device(s)"


def cuda_usable() -> tuple[bool, str]:
    """Whether cuda.core can use a GPU here, and why (or why not); opens no context.

    Returns
    -------
    tuple of (bool, str)
        ``(True, "<device name> (device 0), <total> MiB")`` or ``(False, reason)``.
    """
    count, why = driver_device_count()
    if not count:
        return False, why
    try:
        device = CoreDevice(0)
        total = int(binding.cuDeviceTotalMem(0)[1])
        return True, f"{device.name} (device 0 of {count}), {total >> 20} MiB"
    except Exception as exc:
        return False, f"cuda.core cannot open device 0: {exc}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses the name
        return False


class CudaDevice(Device):
    """One GPU through cuda.core: its primary context, shared with the whole process.

    Parameters
    ----------
    device_id : int
        Which GPU, among those the process sees (``CUDA_VISIBLE_DEVICES`` renumbers them from 0).

    Raises
    ------
    ConfigurationError
        For a device the process does not see (naming how many it sees).
    BackendError
        If the device's context cannot be opened.

    Notes
    -----
    Memory goes back when the last array over a block goes (stream-ordered for the ``driver``
    and ``cupy_async`` resources): ``memory_info`` lags a ``free`` until references drop.
    """

    name = "cuda"
    granule = 2 << 20

    def __init__(self, device_id: int = 0) -> None:
        count, why = driver_device_count()
        if isinstance(device_id, bool) or not isinstance(device_id, int) or not 0 <= device_id < count:
            seen = f"{count} (ids 0 to {count - 1})" if count else f"none ({why})"
            raise ConfigurationError(
                f"no CUDA device {device_id!r}: this process sees {seen}; CUDA_VISIBLE_DEVICES limits "
                "them: pass one of those"
            )
        self.device_id = device_id
        with map_exceptions(f"opening CUDA device {device_id}"):
            previous = binding.cuCtxGetCurrent()[1]
            core = CoreDevice(device_id)
            core.set_current()  # retains the primary context; cheap ever after
            self.context = core.context.handle  # the primary context is never destroyed: look it up once
            self._context = int(self.context)
            self.device_name = str(core.name)
            if int(previous) and int(previous) != self._context:
                binding.cuCtxSetCurrent(previous)  # opening a device is not choosing it
        self._lock = threading.Lock()
        self._waiters: dict[int, StreamWaiter] = {}
        # Recorded events come back here when dropped (CudaEvent.__del__) and are recorded
        # again: a re-record costs a third of a new event.
        self._spare_events: list[Any] = []
        self.default_resource = DEFAULT_RESOURCE

    @property
    def resources(self) -> tuple[str, ...]:
        """The registered allocator names this device can make here (their packages installed)."""
        return tuple(name for name in registered(self.name) if name not in _NEEDS or _installed(_NEEDS[name]))

    # -- activation ---------------------------------------------------------------------------
    def make_current(self) -> None:
        """Make this device's context current in the calling thread, and leave it so.

        One driver query when it already is (no thread-local guess: the user, CuPy or numba may
        have switched devices since); a cuda.core ``set_current`` when it is not.
        """
        if int(binding.cuCtxGetCurrent()[1]) != self._context:
            with map_exceptions(f"making CUDA device {self.device_id} current"):
                CoreDevice(self.device_id).set_current()

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Make this GPU current for the block (numba's, CuPy's and cuda.core's current device),
        then put back whichever context was current before, if another was."""
        previous = binding.cuCtxGetCurrent()[1]
        if int(previous) == self._context:
            yield
            return
        self.make_current()
        try:
            yield
        finally:
            if int(previous):
                binding.cuCtxSetCurrent(previous)

    def synchronize(self) -> None:
        """Block until every stream of the device is idle."""
        self.make_current()
        check(binding.cuCtxSynchronize(), f"synchronizing {self.device_name}")

    # -- resources ----------------------------------------------------------------------------
    def _create_resource(self, name: str) -> MemoryResource:
        """The resource ``name``; where the program uses numba, numba's own allocations on this
        device draw from it from now on (numba's EMM plugin, seed 001)."""
        resource = self._new_resource(name)
        if "numba.cuda" in sys.modules:  # numba in use: never import it here otherwise
            from .._numba import install_memory_manager

            install_memory_manager(self, resource)
        return resource

    def same_device(self, other: object) -> bool:
        """True for a CudaDevice of the same id (another backend's object of this GPU: the same memory)."""
        return isinstance(other, CudaDevice) and other.device_id == self.device_id

    def _new_resource(self, name: str) -> MemoryResource:
        return find_factory(name, self.name)(self)

    # -- memory -------------------------------------------------------------------------------
    def driver_memory(self) -> tuple[int, int]:
        """Free and total bytes as the driver reports them (``cuMemGetInfo`` reads the current context)."""
        self.make_current()
        err, free, total = binding.cuMemGetInfo()
        check((err,), f"reading {self.device_name}'s memory")
        return int(free), int(total)

    def memory_info(self) -> MemoryInfo:
        free, total = self.driver_memory()
        return MemoryInfo(free=free, total=total)

    def free_text(self) -> str:
        """A clause for error messages: the device's free and total memory."""
        free, total = self.driver_memory()
        return f"{free} of {total} bytes free on {self.device_name}"

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        kind = MemoryKind(kind)
        dtype = np.dtype(dtype)
        if kind is MemoryKind.HOST:
            try:
                return np.zeros(shape, dtype)
            except MemoryError as exc:
                raise AllocationError(f"the host has no room for a {shape} {dtype} array") from exc
        if kind is not MemoryKind.PINNED:
            raise InvalidRequestError(f"host arrays are 'pinned' or 'host', not {kind.value!r}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not nbytes:
            return np.zeros(shape, dtype)
        array = self._pin(nbytes, shape, dtype)
        array.fill(0)
        return array

    def _pin(self, nbytes: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """``nbytes`` (> 0) of page-locked host memory as a ``shape`` ``dtype`` array, not zeroed."""
        with map_exceptions(f"pinning {nbytes} bytes of host memory ({shape}, {dtype})"):
            self.make_current()
            memory = HostAllocation(nbytes, _HOST_ALLOC_PINNED, self.context)
        return host_array(Block(memory.ptr, nbytes, MemoryKind.PINNED, None, memory), shape, dtype)

    def _allocate_pinned(self, nbytes: int) -> np.ndarray[Any, Any]:
        """A pinned pool buffer, not zeroed: its users read only what they wrote (a spill's copy overwrites
        it whole; zeroing GiBs on the host took as long as the copy, on the first spill's critical path)."""
        return self._pin(nbytes, (nbytes,), np.dtype(np.uint8))

    def is_pinned(self, array: Any) -> bool:
        """Whether the driver knows ``array``'s memory as page-locked host memory (see :func:`_pinned_at`)."""
        if not isinstance(array, np.ndarray) or not array.nbytes:
            return False
        return _pinned_at(host_address(array), array.nbytes)

    # -- streams, events, copies ------------------------------------------------------------
    def create_stream(self) -> Stream:
        """A new cuda.core ``Stream``, blocking: ordered with the legacy default stream, as CuPy's and numba's are."""
        with map_exceptions(f"creating a stream on {self.device_name}"):
            # cuda.core's Device is a per-thread object that must have been set current in this
            # thread before it makes streams, whatever context is current already (rare: no check)
            core = CoreDevice(self.device_id)
            core.set_current()
            return core.create_stream(options=_STREAM_OPTIONS)

    def record_event(self, stream: Any) -> CudaEvent:
        stream = stream if type(stream) is Stream else as_stream(stream)
        spares = self._spare_events
        try:
            if spares:
                event = stream.record(spares.pop())
            else:
                self.make_current()  # a new event belongs to the current context
                event = stream.record(options=EVENT_OPTIONS)
        except Exception as exc:
            mapped = translate(exc, f"recording an event on {stream!r}")
            if mapped is None:
                raise
            raise mapped from exc
        return CudaEvent(event, stream, self._waiter, spares)

    def _waiter(self, stream: Any) -> StreamWaiter:
        key = stream_handle(stream)
        with self._lock:
            waiter = self._waiters.get(key)
            if waiter is None:
                waiter = self._waiters[key] = StreamWaiter(f"aiocubie-events-{key:#x}")
            return waiter

    def wait_event(self, stream: Any, event: Any) -> None:
        """The stream waits on the GPU for ``event``; the host does not."""
        stream = stream if type(stream) is Stream else as_stream(stream)
        try:
            stream.wait(event.event)
        except Exception as exc:
            mapped = translate(exc, f"making {stream!r} wait for an event")
            if mapped is None:
                raise
            raise mapped from exc

    def copy(self, src: Any, dst: Any, stream: Any, *, tag: object = None) -> None:
        """Queue one ``cuMemcpyAsync``; unified addressing tells the direction.

        That covers every kind and array type on either side (cuda.core's ``Buffer.copy_to``
        would need a Buffer made around each array first). A pageable host side makes the copy
        synchronous, as CUDA does.
        """
        if getattr(src, "shape", None) != getattr(dst, "shape", None) or src.dtype != dst.dtype:
            raise BackendError(
                f"cannot copy {getattr(src, 'shape', '?')} {getattr(src, 'dtype', '?')} into "
                f"{getattr(dst, 'shape', '?')} {getattr(dst, 'dtype', '?')}: shapes and dtypes must match"
            )
        nbytes = int(src.nbytes)
        if not nbytes:
            return
        (src_ptr, src_c), (dst_ptr, dst_c) = pointer_and_contiguity(src), pointer_and_contiguity(dst)
        if not (src_c and dst_c):
            raise BackendError("copies need C-contiguous arrays")
        check(binding.cuMemcpyAsync(dst_ptr, src_ptr, nbytes, stream_handle(stream)), lambda: f"copying {nbytes} bytes")

    def copier(self, array: Any, stream: Any, *, to_device: bool) -> Copier:
        """A :class:`_BoundCopy` for a C-contiguous device ``array``; the general :class:`Copier` otherwise."""
        ptr, contiguous = pointer_and_contiguity(array)
        if isinstance(array, np.ndarray) or not contiguous or not array.nbytes:
            return Copier(self, array, stream, to_device=to_device)
        return _BoundCopy(self, array, stream, ptr, to_device=to_device)

    def copy_strided(self, src: Any, dst: Any, stream: Any, *, tag: object = None) -> None:
        """Queue one ``cuMemcpy2DAsync`` (or ``3D``; a ``cuMemcpyAsync`` for one block) on ``stream``.

        Views whose slices are not whole rows apart go as one 2-D copy a slice; pitches above
        the device's maximum as one copy a row.
        """
        if getattr(src, "shape", None) != getattr(dst, "shape", None) or src.dtype != dst.dtype:
            raise BackendError(
                f"cannot copy {getattr(src, 'shape', '?')} {getattr(src, 'dtype', '?')} into "
                f"{getattr(dst, 'shape', '?')} {getattr(dst, 'dtype', '?')}: shapes and dtypes must match"
            )
        (src_ptr, src_c), (dst_ptr, dst_c) = pointer_and_contiguity(src), pointer_and_contiguity(dst)
        if src_c and dst_c:  # one block (a batch stream's every copy): no geometry to work out
            nbytes = int(src.nbytes)
            if src_ptr < dst_ptr + nbytes and dst_ptr < src_ptr + nbytes:
                raise BackendError(
                    f"a copy's source and target overlap ({nbytes} bytes at {src_ptr:#x} and {dst_ptr:#x}): "
                    "the copy engines would read what they write"
                )
            if nbytes:
                check(
                    binding.cuMemcpyAsync(dst_ptr, src_ptr, nbytes, stream_handle(stream)),
                    lambda: f"copying {nbytes} bytes",
                )
            return
        (src_ptr, src_strides), (dst_ptr, dst_strides) = pointer_and_strides(src), pointer_and_strides(dst)
        found = geometry(src.shape, src.dtype.itemsize, src_strides, dst_strides)
        if found is None:
            raise BackendError(refusal(src.shape))
        if not found.nbytes:
            return
        if src_ptr < dst_ptr + found.extent("dst") and dst_ptr < src_ptr + found.extent("src"):
            raise BackendError(
                f"a strided copy's source and target overlap ({found.extent('src')} bytes at {src_ptr:#x}, "
                f"{found.extent('dst')} at {dst_ptr:#x}): the copy engines would read what they write"
            )
        handle = stream_handle(stream)
        what = lambda: f"copying {found.nbytes} bytes as {found}"  # noqa: E731 - only on failure
        if found.height == 1 and found.depth == 1:
            check(binding.cuMemcpyAsync(dst_ptr, src_ptr, found.width, handle), what)
            return
        if max(found.src_pitch, found.dst_pitch) > self._max_pitch():
            for z in range(found.depth):
                for y in range(found.height):
                    at_src = src_ptr + z * found.src_slice + y * found.src_pitch
                    at_dst = dst_ptr + z * found.dst_slice + y * found.dst_pitch
                    check(binding.cuMemcpyAsync(at_dst, at_src, found.width, handle), what)
            return
        src_host, dst_host = isinstance(src, np.ndarray), isinstance(dst, np.ndarray)
        if found.depth > 1 and found.is_3d("src") and found.is_3d("dst"):
            check(binding.cuMemcpy3DAsync(_copy_3d(found, src_ptr, src_host, dst_ptr, dst_host), handle), what)
            return
        for z in range(found.depth):
            params = _copy_2d(found, src_ptr + z * found.src_slice, src_host, dst_ptr + z * found.dst_slice, dst_host)
            check(binding.cuMemcpy2DAsync(params, handle), what)

    def _max_pitch(self) -> int:
        pitch: int | None = self.__dict__.get("_pitch")
        if pitch is None:
            err, value = binding.cuDeviceGetAttribute(_MAX_PITCH, self.device_id)
            pitch = self.__dict__["_pitch"] = int(value) if err == _SUCCESS else (1 << 31) - 1
        return pitch

    def zero(self, array: Any, stream: Any) -> None:
        """Queue a memset on ``stream`` for device-side arrays; fill host arrays now.

        Host arrays (host, pinned) come straight from an allocation with no work queued on them.
        """
        ptr = device_pointer(array)
        if ptr is None:
            np.asarray(array).fill(0)
        elif array.nbytes:
            nbytes = int(array.nbytes)
            check(binding.cuMemsetD8Async(ptr, 0, nbytes, stream_handle(stream)), lambda: f"zeroing {nbytes} bytes")

    # -- managed memory -----------------------------------------------------------------------
    def prefetch(self, array: Any, device: int | None, stream: Any) -> None:
        buffer = self._managed(array)
        with map_exceptions(lambda: f"prefetching {buffer.size} bytes of managed memory"):
            buffer.prefetch(_location(device), stream=as_stream(stream))

    def advise(self, array: Any, advice: Advice, device: int | None) -> None:
        if advice not in ("preferred_location", "accessed_by", "read_mostly"):
            raise BackendError(
                f"unknown managed-memory advice {advice!r}: use one of 'preferred_location', 'accessed_by', "
                "'read_mostly'"
            )
        buffer = self._managed(array)
        with map_exceptions(f"advising {advice} for managed memory"):
            if advice == "preferred_location":
                buffer.preferred_location = _location(device)
            elif advice == "accessed_by":
                buffer.accessed_by.add(_location(device))
            else:
                buffer.read_mostly = True

    @staticmethod
    def _managed(array: Any) -> Any:
        """A cuda.core ``ManagedBuffer`` over managed ``array`` (holding it), or BackendError if it is not managed."""
        ptr = device_pointer(array)
        managed = False
        if ptr:
            err, value = binding.cuPointerGetAttribute(_IS_MANAGED, ptr)
            managed = err == _SUCCESS and bool(value)
        if not managed:
            raise BackendError(f"prefetch and advice need a managed array, got a {type(array).__name__} that is not")
        return ManagedBuffer.from_handle(ptr, int(array.nbytes), owner=array)

    # -- lifetime -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Wait for queued work, run pending callbacks, stop the waiting threads.

        The primary context is not destroyed (CuPy, numba and the user share it): arrays and
        streams handed out before stay usable in fact, but callers must treat them as invalid,
        as the protocol says, and make new resources.
        """
        try:
            self.synchronize()
        except BackendError:
            pass  # a device error: the waiters below still wake (their events report it)
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.stop()

    def close(self) -> None:
        self.reset()
        self._spare_events.clear()


def _copy_2d(found: Geometry, src: int, src_host: bool, dst: int, dst_host: bool) -> Any:
    """The ``CUDA_MEMCPY2D`` of one slice of ``found``, from address ``src`` to ``dst``."""
    params = binding.CUDA_MEMCPY2D()
    _sides(params, src, src_host, dst, dst_host)
    params.srcPitch, params.dstPitch = found.src_pitch, found.dst_pitch
    params.WidthInBytes, params.Height = found.width, found.height
    return params


def _copy_3d(found: Geometry, src: int, src_host: bool, dst: int, dst_host: bool) -> Any:
    """The ``CUDA_MEMCPY3D`` of all of ``found``: slices are whole rows apart on both sides."""
    params = binding.CUDA_MEMCPY3D()
    _sides(params, src, src_host, dst, dst_host)
    params.srcPitch, params.dstPitch = found.src_pitch, found.dst_pitch
    params.srcHeight, params.dstHeight = found.src_slice // found.src_pitch, found.dst_slice // found.dst_pitch
    params.WidthInBytes, params.Height, params.Depth = found.width, found.height, found.depth
    return params


def _sides(params: Any, src: int, src_host: bool, dst: int, dst_host: bool) -> None:
    if src_host:
        params.srcMemoryType, params.srcHost = _HOST_SIDE, src
    else:
        params.srcMemoryType, params.srcDevice = _UNIFIED_SIDE, src
    if dst_host:
        params.dstMemoryType, params.dstHost = _HOST_SIDE, dst
    else:
        params.dstMemoryType, params.dstDevice = _UNIFIED_SIDE, dst


def _location(device: int | None) -> Any:
    return Host() if device is None else CoreDevice(device)


class _BoundCopy(Copier):
    """One ``cuMemcpyAsync`` between pinned host arrays and a C-contiguous device array: the device
    side's address, size and stream handle worked out once; each copy checks the host side only."""

    __slots__ = ("handle", "nbytes", "ptr", "what")

    def __init__(self, device: CudaDevice, array: Any, stream: Any, ptr: int, *, to_device: bool) -> None:
        super().__init__(device, array, stream, to_device=to_device)
        self.ptr, self.nbytes, self.handle = ptr, int(array.nbytes), stream_handle(stream)
        self.what = f"copying {self.nbytes} bytes"

    def _ready(self, host: np.ndarray[Any, Any]) -> Any:
        """The host array's address, if it is pinned and clear of the device array; else None."""
        address, nbytes, ptr = host_address(host), self.nbytes, self.ptr
        if address < ptr + nbytes and ptr < address + nbytes:  # a host view of managed memory: copy_strided says no
            return None
        return address if _pinned_at(address, nbytes) else None

    def queue(self, ready: Any, tag: object = None) -> None:
        if self.to_device:
            check(binding.cuMemcpyAsync(self.ptr, ready, self.nbytes, self.handle), self.what)
        else:
            check(binding.cuMemcpyAsync(ready, self.ptr, self.nbytes, self.handle), self.what)


#: The package each built-in allocator needs beside cuda.core (where not installed, the device cannot make it).
_NEEDS = {"cupy": "cupy", "cupy_async": "cupy", "numba": "numba_cuda", "rmm": "rmm"}


def _cuda(device: Device) -> CudaDevice:
    if not isinstance(device, CudaDevice):
        raise UnknownAllocatorError(f"a CUDA allocator was asked for on {device.device_name}, not a CUDA device")
    return device


def _numba(device: Device) -> MemoryResource:
    """numba's own memory manager (the numba extra)."""
    try:
        from .._numba import NumbaResource
    except ImportError as exc:
        raise UnknownAllocatorError(
            f"allocator 'numba' needs numba-cuda, which is not importable ({exc}): pip install "
            "'aiocubie[numba]', or use one of 'driver', 'cupy', 'cupy_async'"
        ) from exc
    return NumbaResource(_cuda(device))


def _rmm(device: Device) -> MemoryResource:
    """The device's current RMM resource (the rmm extra)."""
    from ._rmm import RmmResource  # imports rmm: only when asked for

    return RmmResource(_cuda(device))


register_allocator("driver", lambda device: DriverResource(_cuda(device)), backend=CudaDevice.name)
register_allocator("cupy", lambda device: CupyResource(_cuda(device)), backend=CudaDevice.name)
register_allocator("cupy_async", lambda device: CupyAsyncResource(_cuda(device)), backend=CudaDevice.name)
register_allocator("numba", _numba, backend=CudaDevice.name)
register_allocator("rmm", _rmm, backend=CudaDevice.name)
