"""The memory-resource protocol: blocks of memory of a kind, ordered on a stream, and adaptors over them.

As RMM and cuda.core draw it: a resource is ``allocate`` / ``deallocate``; pools, fault
injection and the like are adaptors wrapping an upstream resource, and an adaptor that is off
is not in the stack. A resource knows bytes, not shapes or array types (an ``ArrayMaker`` does),
and nothing of budgets or ledgers (the device account does).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._errors import ConfigurationError
from .._requests import MemoryKind
from .._stats import PoolFacts
from ._stream import StreamLike

__all__ = ["Block", "FailureHandler", "LibraryPool", "MemoryResource", "PoolFacts", "ResourceAdaptor"]

#: What a resource shared with other libraries calls when one of *their* allocations finds no
#: room (RMM's failure callback): given the bytes asked for, it frees what it can and returns
#: True to have the allocation tried again. aiocubie's own allocations never reach it: they
#: recover in the device account, a whole batch at a time.
FailureHandler = Callable[[int], bool]


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
    """Where blocks come from.

    Attributes
    ----------
    name : str
        The name that made it (one of ``ALLOCATORS``, ``"default"`` resolved), also for an
        adaptor stack: the base resource's name.
    """

    name: str

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

    @abc.abstractmethod
    def release_cached(self) -> int:
        """Give the blocks a pool caches back to the device; the bytes this made free (0: none or unknown)."""

    @abc.abstractmethod
    def pool_facts(self) -> PoolFacts:
        """Bytes the pool holds, bytes in use, the largest cached block (None where unknown).

        A pool other libraries draw from too (the device's stream-ordered pool, RMM's) counts
        their bytes in ``in_use``: the manager reports the bytes it does not hold itself as
        other libraries' (``Snapshot.other_bytes``).
        """

    def set_failure_handler(self, handler: FailureHandler | None) -> None:
        """Where other libraries' out-of-memory failures in this pool go (see :data:`FailureHandler`).

        A resource no other library allocates through ignores it (the default).
        """
        return None

    def share_with(self, libraries: Sequence[str], limit: int | None = None) -> None:
        """Make ``libraries`` (``"cupy"``, ``"numba"``, ``"torch"``) allocate from this resource's pool.

        ``limit``: a hard cap inside the allocator on what other libraries hold together (aiocubie's
        own blocks are not under it); an allocation of theirs beyond it is refused.

        Raises
        ------
        ConfigurationError
            Here: only a pool other libraries can draw from (``allocator="rmm"``) can be shared.
        """
        raise ConfigurationError(
            f"cannot share the {self.name!r} allocator's pool with {', '.join(map(repr, libraries)) or 'nothing'}: "
            "only allocator='rmm' is a pool other libraries draw from; create the manager with allocator='rmm' "
            '(pip install "aiocubie[rmm]")'
        )

    def library_pool(self, library: str) -> LibraryPool:
        """A new pool of this resource for ``library``'s own allocations (``"torch"``).

        Raises
        ------
        ConfigurationError
            Here: only a pool other libraries can draw from (``allocator="rmm"``) makes one.
        """
        raise ConfigurationError(
            f"{library}'s allocations can be counted only in a pool it can draw from: the {self.name!r} allocator is "
            'not one; create the manager with allocator="rmm" (pip install "aiocubie[rmm]")'
        )

    def limited(self, nbytes: int) -> MemoryResource | None:
        """A view of this resource whose allocator refuses to hold more than ``nbytes`` at once, or None
        where the allocator has no such cap (the default)."""
        return None


class ResourceAdaptor(MemoryResource):
    """A resource wrapping ``upstream``: each method passes through unless the adaptor overrides it.

    Parameters
    ----------
    upstream : MemoryResource
        The resource it adds to.
    """

    def __init__(self, upstream: MemoryResource) -> None:
        self.upstream = upstream
        self.name = upstream.name

    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        return self.upstream.allocate(nbytes, kind, stream)

    def deallocate(self, block: Block) -> None:
        self.upstream.deallocate(block)

    def release_cached(self) -> int:
        return self.upstream.release_cached()

    def pool_facts(self) -> PoolFacts:
        return self.upstream.pool_facts()

    def set_failure_handler(self, handler: FailureHandler | None) -> None:
        self.upstream.set_failure_handler(handler)

    def share_with(self, libraries: Sequence[str], limit: int | None = None) -> None:
        self.upstream.share_with(libraries, limit)

    def library_pool(self, library: str) -> LibraryPool:
        return self.upstream.library_pool(library)

    def limited(self, nbytes: int) -> MemoryResource | None:
        """The upstream's capped view (this adaptor is not in it)."""
        return self.upstream.limited(nbytes)
