"""Adaptors a user stacks over any resource: statistics, a limit, a failure callback (as ``rmm.mr`` has them).

Each wraps an upstream :class:`~aiocubie._backends._resource.MemoryResource` and adds one thing;
they work on every backend and over one another::

    StatisticsAdaptor(LimitingAdaptor(device.create_resource("cupy"), 1 << 30))
"""

from __future__ import annotations

from collections.abc import Callable

from .._errors import ConfigurationError, OutOfMemoryError, shown
from .._names import MemoryKind
from ._resource import Block, MemoryResource, ResourceAdaptor, stack
from ._stream import StreamLike

__all__ = ["FailureCallbackAdaptor", "LimitingAdaptor", "StatisticsAdaptor", "limiting_adaptors"]

_DEVICE, _MANAGED = MemoryKind.DEVICE, MemoryKind.MANAGED


def _upstream(value: object) -> MemoryResource:
    if not isinstance(value, MemoryResource):
        raise ConfigurationError(
            f"an adaptor wraps a MemoryResource (e.g. backend.device.create_resource('driver')), got {shown(value)}"
        )
    return value


class StatisticsAdaptor(ResourceAdaptor):
    """Counts the blocks and bytes that pass through it (rmm's ``StatisticsResourceAdaptor``).

    Parameters
    ----------
    upstream : MemoryResource
        The resource whose allocations it counts.

    Attributes
    ----------
    current_bytes, peak_bytes, total_bytes : int
        Bytes of the blocks handed out and not given back; their most at once; of every block handed out.
    current_count, peak_count, total_count : int
        The same, in blocks.
    """

    def __init__(self, upstream: MemoryResource) -> None:
        super().__init__(_upstream(upstream))
        self.current_bytes = self.peak_bytes = self.total_bytes = 0
        self.current_count = self.peak_count = self.total_count = 0

    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        block = self.upstream.allocate(nbytes, kind, stream)
        self.current_bytes += nbytes
        self.total_bytes += nbytes
        self.current_count += 1
        self.total_count += 1
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        self.peak_count = max(self.peak_count, self.current_count)
        return block

    def deallocate(self, block: Block) -> None:
        self.upstream.deallocate(block)
        self.current_bytes -= block.nbytes
        self.current_count -= 1


class LimitingAdaptor(ResourceAdaptor):
    """Refuses to hold more than ``limit`` bytes of device memory at once (rmm's ``LimitingResourceAdaptor``).

    Device and managed blocks count against the limit; host kinds pass through. An allocation
    over it raises :class:`OutOfMemoryError` before the upstream is asked. Its pool facts are
    the upstream's: the limit is :attr:`limit`, what it holds :attr:`held`.

    Parameters
    ----------
    upstream : MemoryResource
        The resource it caps.
    limit : int
        The most device bytes its blocks may add up to, > 0.
    """

    def __init__(self, upstream: MemoryResource, limit: int) -> None:
        super().__init__(_upstream(upstream))
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ConfigurationError(f"limit must be an int of bytes > 0 (e.g. 1 << 30), got {shown(limit)}")
        self.limit = limit
        self.held = 0

    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        if kind is not _DEVICE and kind is not _MANAGED:
            return self.upstream.allocate(nbytes, kind, stream)
        if self.held + nbytes > self.limit:
            raise OutOfMemoryError(
                f"out of memory: {nbytes} bytes more of {kind.value} memory would exceed the allocator's limit of "
                f"{self.limit} ({self.held} held): give blocks back, or raise the LimitingAdaptor's limit"
            )
        block = self.upstream.allocate(nbytes, kind, stream)
        self.held += nbytes
        return block

    def deallocate(self, block: Block) -> None:
        self.upstream.deallocate(block)
        if block.kind is _DEVICE or block.kind is _MANAGED:
            self.held -= block.nbytes


def limiting_adaptors(resource: MemoryResource) -> tuple[LimitingAdaptor, ...]:
    """The :class:`LimitingAdaptor` s in ``resource``'s stack (itself, then each adaptor's upstream, down)."""
    return tuple(each for each in stack(resource) if isinstance(each, LimitingAdaptor))


class FailureCallbackAdaptor(ResourceAdaptor):
    """Calls ``callback(nbytes)`` when the upstream is out of memory, and tries again while it returns True
    (rmm's ``FailureCallbackResourceAdaptor``).

    The manager's own out-of-memory recovery (releasing the pool's cache, reclaim hooks) runs
    above the stack, a whole batch at a time; this adaptor is for a step of a user's own
    (spilling a cache of theirs) that must run at the failing allocation.

    Parameters
    ----------
    upstream : MemoryResource
        The resource whose failures it handles.
    callback : callable
        Given the bytes asked for; frees what it can and returns True to have the allocation tried
        again, False to let the :class:`OutOfMemoryError` through.
    """

    def __init__(self, upstream: MemoryResource, callback: Callable[[int], bool]) -> None:
        super().__init__(_upstream(upstream))
        if not callable(callback):
            raise ConfigurationError(f"callback must be callable with the bytes asked for, got {shown(callback)}")
        self.callback = callback

    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        while True:
            try:
                return self.upstream.allocate(nbytes, kind, stream)
            except OutOfMemoryError:
                if not self.callback(nbytes):
                    raise
