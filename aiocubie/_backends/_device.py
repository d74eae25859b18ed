"""The device protocol: streams, events, copies, fills, memory readings, managed memory, activation.

A :class:`Device` is one GPU (or the simulator's model of one). It hands out no device memory
itself: a :class:`~aiocubie._backends._resource.MemoryResource` does (:meth:`Device.create_resource`).
Devices are synchronous and called from the event-loop thread; only event callbacks run elsewhere.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Literal

import attrs
import numpy as np

from .._names import MemoryKind
from .._protocols import Event
from ._allocators import DEFAULT_ALLOCATOR, parse_allocator, registered
from ._pinned import PinnedPool
from ._resource import Block, MemoryResource
from ._stream import StreamLike

__all__ = ["Advice", "Copier", "Device", "Event", "MemoryInfo"]

#: Managed-memory advice (seed 004).
Advice = Literal["preferred_location", "accessed_by", "read_mostly"]


@attrs.frozen
class MemoryInfo:
    """Device memory in bytes, as the driver reports it.

    Blocks a pool caches count as used here; the device account adds its resource stack's
    cached bytes when it plans (``DeviceAccount.memory_info``).
    """

    free: int
    total: int


class Copier:
    """Copies between host arrays and one device array on one stream, bound once for many (see :meth:`Device.copier`).

    A batch stream copies every batch into and out of the same arrays: a device's copier may
    work out once what does not change (the array's address, the stream's handle) and check
    only the host side of each copy.

    Parameters
    ----------
    device : Device
        The device that copies.
    array : array
        The device array (any kind the device's resources made).
    stream : StreamLike
        The stream the copies are queued on.
    to_device : bool
        Host -> ``array`` (True), or ``array`` -> host.
    """

    __slots__ = ("array", "device", "dtype", "shape", "stream", "to_device")

    def __init__(self, device: Device, array: Any, stream: StreamLike, *, to_device: bool) -> None:
        self.device, self.array, self.stream, self.to_device = device, array, stream, to_device
        self.shape, self.dtype = tuple(array.shape), np.dtype(array.dtype)

    def __call__(self, host: Any, tag: object = None) -> None:
        """Queue the copy with ``host``, as :meth:`Device.copy_strided` would (``tag`` as for it)."""
        if self.to_device:
            self.device.copy_strided(host, self.array, self.stream, tag=tag)
        else:
            self.device.copy_strided(self.array, host, self.stream, tag=tag)

    def straight(self, host: Any) -> Any:
        """What :meth:`queue` takes to copy ``host``, if it goes straight: a pinned C-contiguous numpy
        array of the device array's shape and dtype (writable, copied into); else None."""
        if (
            type(host) is np.ndarray
            and host.shape == self.shape
            and host.dtype == self.dtype
            and host.flags.c_contiguous
            and (self.to_device or host.flags.writeable)
        ):
            return self._ready(host)
        return None

    def _ready(self, host: np.ndarray[Any, Any]) -> Any:
        """What :meth:`queue` takes for ``host`` (of the right shape, dtype and order) if it is pinned, else None."""
        return host if self.device.is_pinned(host) else None

    def queue(self, ready: Any, tag: object = None) -> None:
        """Queue the copy with a host array :meth:`straight` made ready (``tag`` as for :meth:`__call__`)."""
        if self.to_device:  # as __call__ does, one call less: a batch stream queues two a batch
            self.device.copy_strided(ready, self.array, self.stream, tag=tag)
        else:
            self.device.copy_strided(self.array, ready, self.stream, tag=tag)


class Device(abc.ABC):
    """One device: streams, events, copies and fills, memory readings, managed memory.

    Attributes
    ----------
    name : str
        ``"simulator"`` or ``"cuda"``.
    device_id : int
        The device's id among those the process sees (0: the first).
    device_name : str
        Human-readable device name.
    granule : int
        Bytes the planner keeps free for allocator rounding and fragmentation.
    default_resource : str
        What ``"default"`` names on this device.
    """

    name: str
    device_id: int = 0
    device_name: str
    granule: int
    default_resource: str

    @property
    def resources(self) -> tuple[str, ...]:
        """The allocator names registered for this device's backend (``"default"`` not among them)."""
        return registered(self.name)

    # -- memory resources -------------------------------------------------------------------
    def create_resource(self, name: str) -> MemoryResource:
        """A new memory resource ``name`` (a registered allocator, see ``allocator_names``) on this device.

        The resource (an adaptor stack a factory composed too) is named ``name`` (``"default"`` resolved).

        Raises
        ------
        UnknownAllocatorError
            For a name not registered for this backend, or one this device cannot make here (the
            message says what is missing and what to install).
        """
        if parse_allocator(name) == DEFAULT_ALLOCATOR:
            name = self.default_resource
        resource = self._create_resource(name)
        resource.name = name
        if resource.device is None:  # a factory's stack over a resource made elsewhere keeps that one's device
            resource.device = self
        return resource

    def same_device(self, other: object) -> bool:
        """True if ``other`` (a resource's ``device``) drives the same memory as this device."""
        return other is self

    @abc.abstractmethod
    def _create_resource(self, name: str) -> MemoryResource:
        """The resource ``name`` (a registered name other than ``"default"``)."""

    # -- memory -----------------------------------------------------------------------------
    @abc.abstractmethod
    def memory_info(self) -> MemoryInfo:
        """Free and total device memory, as the driver reports them. May cost tens of microseconds."""

    @abc.abstractmethod
    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        """A zeroed numpy array of host memory: ``pinned`` (page-locked) or ``host`` (pageable).

        Raises
        ------
        InvalidRequestError
            For any other kind.
        AllocationError
            When the host has not that much memory.
        """

    @abc.abstractmethod
    def is_pinned(self, array: Any) -> bool:
        """True if host ``array`` (or the array it views) is page-locked, so copies from and
        to it can run asynchronously on a copy engine."""

    def check_host(self, array: np.ndarray[Any, Any]) -> None:  # noqa: B027 - optional: a GPU cannot tell
        """Raise :class:`ReleasedError` if host ``array`` views the memory of a released response
        (the simulator knows it; a GPU's device does not check). Copies check their ends; this is
        for host arrays a walk copies on the host (pageable data packed into staging buffers)."""

    def spilled(self, block: Block) -> None:  # noqa: B027 - optional: a GPU cannot tell
        """``block`` is about to be freed because its array was spilled to host: the simulator makes
        every later touch of it raise :class:`SpilledError`; on a GPU such a touch is undefined."""

    @property
    def pinned_pool(self) -> PinnedPool:
        """The device's pool of page-locked staging buffers (made on first use)."""
        pool: PinnedPool | None = self.__dict__.get("_pinned_pool")
        if pool is None:
            pool = self.__dict__["_pinned_pool"] = PinnedPool(self._allocate_pinned)
        return pool

    def _allocate_pinned(self, nbytes: int) -> np.ndarray[Any, Any]:
        return self.host_array((nbytes,), np.dtype(np.uint8), MemoryKind.PINNED)

    # -- streams, events, copies ------------------------------------------------------------
    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the calling thread until every stream of the device is idle (stream-ordered frees landed)."""

    @abc.abstractmethod
    def create_stream(self) -> StreamLike:
        """A new stream (a :class:`StreamLike`). Work on one stream completes in the order queued."""

    @abc.abstractmethod
    def record_event(self, stream: StreamLike) -> Event:
        """Record an event on ``stream`` after everything queued so far.

        Raises
        ------
        BackendError
            If the event cannot be recorded.
        """

    @abc.abstractmethod
    def wait_event(self, stream: StreamLike, event: Event) -> None:
        """Make work queued on ``stream`` from now on wait until ``event`` completes.

        The host does not wait. ``event`` is one this device recorded, on any stream; what is
        recorded on it later does not change what ``stream`` waits for.

        Raises
        ------
        BackendError
            If the wait cannot be queued.
        """

    @abc.abstractmethod
    def copy(self, src: Any, dst: Any, stream: StreamLike, *, tag: object = None) -> None:
        """Queue a copy from array ``src`` to array ``dst`` (any kinds) on ``stream``.

        ``tag`` names the copy for a device that keeps a timeline (the simulator's); others
        ignore it.

        Raises
        ------
        BackendError
            On mismatched shapes or dtypes, non-contiguous arrays, or a failed copy.
        """

    @abc.abstractmethod
    def copy_strided(self, src: Any, dst: Any, stream: StreamLike, *, tag: object = None) -> None:
        """Queue a copy between two views of one shape and dtype that need not be contiguous, on ``stream``.

        The copy engines move them without repacking: rows of contiguous bytes, as one 1-D,
        2-D or 3-D copy (:func:`~aiocubie._backends._strided.geometry` says which), or one
        2-D copy a slice where the slices of a side are not whole rows apart. A chunk's slice
        of a host array whose run axis is not the first, into or out of a chunk buffer
        trimmed to the chunk's length, is one 2-D copy. ``tag`` as for :meth:`copy`.

        Raises
        ------
        BackendError
            On mismatched shapes or dtypes; views that are not rows of contiguous elements
            on both sides (reversed, broadcast, more than three levels: copy those through a
            contiguous array); ``src`` and ``dst`` overlapping in memory; a failed copy.
        """

    def copier(self, array: Any, stream: StreamLike, *, to_device: bool) -> Copier:
        """A :class:`Copier`: copies between host arrays and ``array`` on ``stream``, bound once for many."""
        return Copier(self, array, stream, to_device=to_device)

    @abc.abstractmethod
    def zero(self, array: Any, stream: StreamLike) -> None:
        """Queue a fill of ``array`` (any kind this device's resources and array makers made) with zeros."""

    # -- managed memory ---------------------------------------------------------------------
    @abc.abstractmethod
    def prefetch(self, array: Any, device: int | None, stream: StreamLike) -> None:
        """Queue a prefetch of managed ``array`` to ``device`` (None: the CPU) on ``stream``."""

    @abc.abstractmethod
    def advise(self, array: Any, advice: Advice, device: int | None) -> None:
        """Give managed-memory ``advice`` for ``array`` about ``device`` (None: the CPU)."""

    # -- context ----------------------------------------------------------------------------
    def activate(self) -> contextlib.AbstractContextManager[Any]:
        """A context manager that makes this device current in the calling thread.

        Kernels and CuPy work on this device's arrays need it current; cheap when it already
        is. A device with nothing to switch (the simulator) returns a null context.
        """
        return contextlib.nullcontext()

    @abc.abstractmethod
    def reset(self) -> None:
        """Reset the context: every array, block and stream handed out before is invalid.

        Resources stay usable (what they cached is gone with the context); blocks they handed out
        before must not be given back.
        """

    def close(self) -> None:  # noqa: B027 - optional: a device that holds nothing need not override it
        """Release what the device holds (threads, pools). Idempotent."""
