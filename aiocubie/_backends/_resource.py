"""The memory-resource protocol: blocks of memory of a kind, ordered on a stream, and adaptors over them.

As RMM and cuda.core draw it: a resource is ``allocate`` / ``deallocate``; pools, fault
injection and the like are adaptors wrapping an upstream resource, and an adaptor that is off
is not in the stack. A resource knows bytes, not shapes or array types (an ``ArrayMaker`` does),
and nothing of budgets or ledgers (the device account does).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from .._errors import ConfigurationError
from .._names import MemoryKind
from ._stream import StreamLike

__all__ = [
    "Block",
    "FailureHandler",
    "LibraryPool",
    "MemoryResource",
    "PoolFacts",
    "ResourceAdaptor",
    "SharedPool",
    "on_failure",
    "require_shared_pool",
    "shared_pool",
    "stack",
]

#: What a resource shared with other libraries calls when one of *their* allocations finds no
#: room (RMM's failure callback): given the bytes asked for, it frees what it can and returns
#: True to have the allocation tried again. aiocubie's own allocations never reach it: they
#: recover in the device account, a whole batch at a time.
FailureHandler = Callable[[int], bool]


@attrs.frozen
class PoolFacts:
    """What the allocator's pool holds, so fragmentation shows (None where the allocator cannot say).

    ``held``: device bytes the pool has taken from the device (in use or cached for reuse);
    ``in_use``: bytes of the blocks handed out now; ``largest_free``: the largest cached block,
    the biggest allocation the pool can serve without asking the device. ``held - in_use``
    bytes are cached: counted as free by the planner, yet only reusable in blocks of at most
    ``largest_free`` bytes until they are released to the device.
    """

    held: int | None = None
    in_use: int | None = None
    largest_free: int | None = None

    @property
    def cached(self) -> int | None:
        """Bytes the pool keeps but no array uses (None if unknown)."""
        return None if self.held is None or self.in_use is None else self.held - self.in_use


@attrs.define(slots=True, eq=False)  # not frozen: made on every allocation, and frozen attrs cost 2.5x
class Block:
    """Memory a resource handed out (read-only by convention: nothing assigns its fields).

    Attributes
    ----------
    ptr : int
        Its address: a device address, or a host one for host kinds (0 for an empty block; the
        simulator's blocks carry a stand-in, as its streams do).
    nbytes : int
        Its size in bytes, as asked for.
    kind : MemoryKind
        The kind of memory.
    stream : StreamLike or None
        The stream it was allocated on; a stream-ordered free goes there.
    handle : object
        What keeps the memory alive (a cuda.core ``Buffer``, a CuPy ``MemoryPointer``, the
        simulator's numpy buffer). An array made over the block holds it: the memory goes
        back when the last array over it goes, even after :meth:`MemoryResource.deallocate`.
    """

    ptr: int
    nbytes: int
    kind: MemoryKind
    stream: StreamLike | None
    handle: Any


class LibraryPool(abc.ABC):
    """A pool of this resource that another library's allocations go to while it is entered (torch's ``MemPool``).

    Entering routes the library's allocations *of the calling thread* to the pool (``with`` only:
    synchronous code; nothing inside may await, or other tasks' allocations land in it too).
    """

    @abc.abstractmethod
    def __enter__(self) -> None: ...

    @abc.abstractmethod
    def __exit__(self, *exc: object) -> None: ...

    @abc.abstractmethod
    def held(self) -> int:
        """Device bytes the pool holds now (in use, or cached by the library for reuse)."""


class MemoryResource(abc.ABC):
    """Where blocks come from: the protocol every resource and adaptor follows.

    A resource writes :meth:`allocate` and :meth:`deallocate`; a pool also says what it holds
    (:meth:`pool_facts`) and gives its cache back (:meth:`release_cached`). What only some
    stacks have is an adaptor (``aiocubie.mr``) or a :class:`SharedPool`, never a method every
    resource must forward.

    Attributes
    ----------
    name : str
        The allocator name that made it (``"default"`` resolved); for an adaptor stack, the
        base resource's name.
    device : Device or None
        The device that made it (``Device.create_resource``); for an adaptor stack, the base
        resource's. None for one made otherwise: a manager then cannot check it is its device's.
    """

    name: str
    device: Any = None

    @abc.abstractmethod
    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        """A block of ``nbytes`` bytes (0 allowed) of ``kind``, ordered on ``stream``.

        ``stream`` may be None for the host kinds (``host``, ``pinned``).

        Raises
        ------
        OutOfMemoryError
            When the device (or pool) has no room: the caller may release cached blocks
            (:meth:`release_cached`) and try again.
        AllocationError
            When it fails otherwise (the host is out of memory, an injected fault fires,
            managed memory beyond what is free is refused).
        """

    @abc.abstractmethod
    def deallocate(self, block: Block) -> None:
        """Give ``block`` back, ordered on the stream it was allocated on.

        The caller drops its references to the block and to arrays over it; arrays others
        still hold keep the memory alive (see :class:`Block`). Each block is deallocated once:
        a second time is a bug the simulator reports loudly (``BackendError``).
        """

    def release_cached(self) -> int:
        """Give the blocks a pool caches back to the device; the bytes this made free (0: none or unknown)."""
        return 0

    def pool_facts(self) -> PoolFacts:
        """Bytes the pool holds, bytes in use, the largest cached block (None where unknown: the default).

        A pool other libraries draw from too (the device's stream-ordered pool, RMM's) counts
        their bytes in ``in_use``: the manager reports the bytes it does not hold itself as
        other libraries' (``Snapshot.other_bytes``).
        """
        return PoolFacts()


class SharedPool(MemoryResource):
    """A pool other libraries allocate from too (``allocator="rmm"``): shared with them, counted per library pool.

    The device account finds it anywhere in its stack (:func:`shared_pool`): adaptors over it
    forward none of this.
    """

    @abc.abstractmethod
    def set_failure_handler(self, handler: FailureHandler | None) -> None:
        """Where other libraries' out-of-memory failures in this pool go (see :data:`FailureHandler`)."""

    @abc.abstractmethod
    def share_with(self, libraries: Sequence[str], limit: int | None = None) -> None:
        """Make ``libraries`` (``"cupy"``, ``"numba"``, ``"torch"``) allocate from this pool.

        ``limit``: a hard cap inside the allocator on what other libraries hold together (aiocubie's
        own blocks are not under it); an allocation of theirs beyond it is refused.

        Raises
        ------
        ConfigurationError
            For a library that cannot be routed, or a second, different limit.
        """

    @abc.abstractmethod
    def library_pool(self, library: str) -> LibraryPool:
        """A new pool of this resource for ``library``'s own allocations (``"torch"``).

        Raises
        ------
        ConfigurationError
            For a library whose allocations cannot be counted per pool.
        """


class ResourceAdaptor(MemoryResource):
    """A resource wrapping ``upstream``: allocation, release of the cache and pool facts pass through
    unless the adaptor overrides them.

    Parameters
    ----------
    upstream : MemoryResource
        The resource it adds to.
    """

    def __init__(self, upstream: MemoryResource) -> None:
        self.upstream = upstream
        self.name, self.device = upstream.name, upstream.device

    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        return self.upstream.allocate(nbytes, kind, stream)

    def deallocate(self, block: Block) -> None:
        self.upstream.deallocate(block)

    def release_cached(self) -> int:
        return self.upstream.release_cached()

    def pool_facts(self) -> PoolFacts:
        return self.upstream.pool_facts()


def stack(resource: MemoryResource) -> Iterator[MemoryResource]:
    """``resource``, then each adaptor's upstream, down to the resource at the bottom."""
    below: object = resource
    while isinstance(below, MemoryResource):
        yield below
        below = getattr(below, "upstream", None)


def shared_pool(resource: MemoryResource) -> SharedPool | None:
    """The :class:`SharedPool` in ``resource``'s stack (itself, or an adaptor's upstream, down), or None."""
    return next((each for each in stack(resource) if isinstance(each, SharedPool)), None)


def on_failure(resource: MemoryResource, handler: FailureHandler | None) -> None:
    """Send other libraries' out-of-memory failures in ``resource``'s :class:`SharedPool` (if any) to ``handler``."""
    pool = shared_pool(resource)
    if pool is not None:
        pool.set_failure_handler(handler)


def require_shared_pool(resource: MemoryResource, what: str) -> SharedPool:
    """The :class:`SharedPool` in ``resource``'s stack, for ``what`` (a clause: "sharing the pool with 'cupy'").

    Raises
    ------
    ConfigurationError
        Where there is none: only ``allocator="rmm"`` is a pool other libraries draw from.
    """
    pool = shared_pool(resource)
    if pool is None:
        raise ConfigurationError(
            f"{what}: the {resource.name!r} allocator is not a pool other libraries draw from (only allocator='rmm' "
            'is); create the manager with allocator="rmm" (pip install "aiocubie[rmm]")'
        )
    return pool
