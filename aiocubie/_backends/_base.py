"""The backend protocol: the one seam between aiocubie and a device (real or simulated).

Every backend allocates by memory kind on a stream, frees, reports memory, records events
and copies. Backends are synchronous and called from the event-loop thread; only their
event callbacks may run on other threads. Only modules under ``_backends`` import numba.cuda
or cupy, and they translate those libraries' errors into aiocubie's.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import Any, Literal

import attrs
import numpy as np

from .._errors import ConfigurationError, shown
from .._requests import MemoryKind
from .._stats import PoolFacts
from ._staging import PinnedPool

__all__ = ["ALLOCATORS", "ARRAY_TYPES", "Advice", "Backend", "Event", "MemoryInfo", "PoolFacts", "parse_array_type"]

#: Allocator plugins a backend can switch between with ``set_allocator`` (seed 000): which
#: pool supplies device blocks (numba's own allocations included).
ALLOCATORS = ("default", "cupy", "cupy_async")

#: Array types a backend hands out for device-side kinds (device, managed, mapped): CuPy
#: arrays (the default) or numba device arrays. Host kinds (host, pinned) are numpy arrays.
ARRAY_TYPES = ("cupy", "numba")
DEFAULT_ARRAY_TYPE = "cupy"

CUPY_EXTRA_HINT = (
    "install CuPy with the extra that matches your CUDA: pip install 'aiocubie[cuda12]' or 'aiocubie[cuda13]'"
)


def parse_array_type(array_type: str | None) -> str:
    """The array type named by ``array_type`` (None: ``"cupy"``).

    Raises
    ------
    ConfigurationError
        For a name not in :data:`ARRAY_TYPES`.
    """
    if array_type is None:
        return DEFAULT_ARRAY_TYPE
    if not isinstance(array_type, str) or array_type not in ARRAY_TYPES:
        raise ConfigurationError(
            f"unknown array type {shown(array_type)}: use one of {', '.join(map(repr, ARRAY_TYPES))} "
            f"('cupy' needs CuPy: pip install 'aiocubie[cuda12]' or 'aiocubie[cuda13]')"
        )
    return array_type


#: Managed-memory advice (seed 004).
Advice = Literal["preferred_location", "accessed_by", "read_mostly"]


@attrs.frozen
class MemoryInfo:
    """Device memory in bytes, as the backend sees it (``free`` includes pool slack)."""

    free: int
    total: int


class Event(abc.ABC):
    """A point in a stream: done once all work queued on the stream before it is done."""

    @abc.abstractmethod
    def query(self) -> bool:
        """True once the event has completed. Never blocks."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the calling thread until the event completes (for worker threads and tests)."""

    @abc.abstractmethod
    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the event completes, from any thread.

        If the event is already complete the callback may run at once, on the calling thread.
        The callback must be quick and must not call into the device library.
        """


class Backend(abc.ABC):
    """A device: memory, streams, events and copies.

    Attributes
    ----------
    name : str
        ``"simulator"`` or ``"cuda"``.
    allocator : str
        The allocator plugin in use, one of :data:`ALLOCATORS`.
    array_type : str
        The array type handed out for device-side kinds, one of :data:`ARRAY_TYPES`.
    granule : int
        Bytes the planner keeps free for allocator rounding and fragmentation.
    device_name : str
        Human-readable device name.
    device : int
        The device's id among those the process sees (default 0, the first).
    """

    name: str
    allocator: str
    array_type: str
    granule: int
    device_name: str
    device: int = 0

    @abc.abstractmethod
    def memory_info(self) -> MemoryInfo:
        """Free and total device memory. May cost tens of microseconds on a GPU."""

    @abc.abstractmethod
    def create_stream(self) -> Any:
        """A new stream. Work on one stream completes in the order it was queued."""

    @abc.abstractmethod
    def allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind, stream: Any) -> Any:
        """Allocate one C-contiguous array of ``kind``, ordered on ``stream``.

        ``device``, ``managed`` and ``mapped`` give an array of :attr:`array_type` (built
        over the block the allocator hands out); ``pinned`` and ``host`` give numpy arrays.

        Raises
        ------
        OutOfMemoryError
            When the device (or pool) has no room: the caller may release cached blocks
            (:meth:`release_cached`) and try again.
        AllocationError
            When it fails otherwise, or an injected fault fires.
        """

    @abc.abstractmethod
    def pool_facts(self) -> PoolFacts:
        """Bytes the allocator's pool holds, bytes in use, the largest cached block (None where unknown)."""

    @abc.abstractmethod
    def release_cached(self) -> int:
        """Give the blocks the pool caches (and frees the allocator deferred) back to the device.

        Returns the bytes this made free on the device (0 if none, or unknown). Arrays in
        use stay valid.
        """

    @abc.abstractmethod
    def zero(self, array: Any, stream: Any) -> None:
        """Queue a fill of ``array`` with zeros on ``stream``."""

    @abc.abstractmethod
    def free(self, array: Any) -> None:
        """Release ``array`` now; the caller drops every reference it holds to it."""

    @abc.abstractmethod
    def nbytes(self, array: Any) -> int:
        """Bytes ``array`` takes."""

    @abc.abstractmethod
    def record_event(self, stream: Any) -> Event:
        """Record an event on ``stream`` after everything queued so far.

        Raises
        ------
        BackendError
            If the event cannot be recorded.
        """

    @abc.abstractmethod
    def copy(self, src: Any, dst: Any, stream: Any, *, tag: object = None) -> None:
        """Queue a copy from ``src`` to ``dst`` (host->device or device->host) on ``stream``.

        ``tag`` names the copy for a backend that keeps a timeline (the simulator's);
        others ignore it.

        Raises
        ------
        BackendError
            On mismatched shapes or dtypes, or a failed copy.
        """

    @abc.abstractmethod
    def wait_event(self, stream: Any, event: Event) -> None:
        """Make work queued on ``stream`` from now on wait until ``event`` completes.

        The host does not wait. ``event`` is one this backend recorded, on any stream; what
        is recorded on it later does not change what ``stream`` waits for.

        Raises
        ------
        BackendError
            If the wait cannot be queued.
        """

    @abc.abstractmethod
    def is_pinned(self, array: Any) -> bool:
        """True if host ``array`` (or the array it views) is page-locked, so copies from and
        to it can run asynchronously on a copy engine."""

    @property
    def pinned_pool(self) -> PinnedPool:
        """The backend's pool of page-locked staging buffers (made on first use)."""
        pool: PinnedPool | None = self.__dict__.get("_pinned_pool")
        if pool is None:
            pool = self.__dict__["_pinned_pool"] = PinnedPool(self._allocate_pinned)
        return pool

    def _allocate_pinned(self, nbytes: int) -> np.ndarray[Any, Any]:
        array: np.ndarray[Any, Any] = self.allocate((nbytes,), np.dtype(np.uint8), MemoryKind.PINNED, None)
        return array

    @abc.abstractmethod
    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        """A zeroed host array: ``pinned`` (page-locked) or ``host`` (pageable)."""

    @abc.abstractmethod
    def prefetch(self, array: Any, device: int | None, stream: Any) -> None:
        """Queue a prefetch of managed ``array`` to ``device`` (None: the CPU) on ``stream``."""

    @abc.abstractmethod
    def advise(self, array: Any, advice: Advice, device: int | None) -> None:
        """Give managed-memory ``advice`` for ``array`` about ``device`` (None: the CPU)."""

    @abc.abstractmethod
    def set_allocator(self, name: str) -> None:
        """Swap the allocator plugin through a context reset.

        Every array and stream handed out before is invalid afterwards.

        Raises
        ------
        UnknownAllocatorError
            If ``name`` is not one of :data:`ALLOCATORS` (or is unavailable here).
        """

    @abc.abstractmethod
    def reset(self) -> None:
        """Reset the context: every array and stream handed out before is invalid."""

    def activate(self) -> contextlib.AbstractContextManager[Any]:
        """A context manager that makes this device current in the calling thread.

        Kernels and CuPy work on this backend's arrays need their device current; a backend
        with one device (the simulator) has nothing to switch.
        """
        return contextlib.nullcontext()

    def close(self) -> None:  # noqa: B027 - optional: a backend that holds nothing need not override it
        """Release what the backend holds (threads, pools). Idempotent."""
