"""The simulator's memory: the device's bytes, the resource over them, the pool model and injected faults.

:class:`SimMemory` is the base resource (every block is fresh numpy memory; device-side bytes
count against the device's total); :class:`SimPool` models CuPy's pools as an adaptor (freed
device blocks stay cached and serve a request of their size or smaller: split, never merged);
:class:`SimShared` models RMM's pool shared with other libraries, :class:`SimFaults` fires the injected allocation faults. Each fails loudly where a GPU would
corrupt memory: a block given back twice, or given back after a context reset, is an error.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from ..._errors import AllocationError, BackendError, ConfigurationError, OutOfMemoryError, ReleasedError, SpilledError
from ..._names import MemoryKind
from .._resource import Block, FailureHandler, LibraryPool, MemoryResource, PoolFacts, ResourceAdaptor, SharedPool
from .._stream import StreamLike
from ._faults import Faults
from ._streams import SimStream, on_worker

__all__ = [
    "SimFaults",
    "SimMemory",
    "SimPool",
    "SimShared",
    "SimState",
    "check_live",
    "host_memory",
    "mark_spilled",
    "poison",
]

#: The memory of blocks given back, or lost to a context reset, by id: the simulator's arrays over
#: it refuse every use from the host at once (on a GPU it may hold another array's data by now),
#: and copies refuse the numpy arrays of host kinds over it.
_RELEASED: weakref.WeakValueDictionary[int, np.ndarray[Any, Any]] = weakref.WeakValueDictionary()
#: The same memory once its free ran: on its stream, after the work queued there before the free
#: (a stream-ordered free, as the driver's pool does it). What an engine runs must not touch it.
_FREED: weakref.WeakValueDictionary[int, np.ndarray[Any, Any]] = weakref.WeakValueDictionary()
#: The memory of blocks freed because their array was spilled to host: a touch raises SpilledError.
_SPILLED: weakref.WeakValueDictionary[int, np.ndarray[Any, Any]] = weakref.WeakValueDictionary()


def mark_spilled(block: Block) -> None:
    """The array over ``block`` went to host and the block is about to be freed: a touch of it from
    now on raises :class:`SpilledError` (not ReleasedError: the array lives on, in ``use()``)."""
    data = block.handle
    if isinstance(data, np.ndarray) and data.size:
        _SPILLED[id(data)] = data


def poison(block: Block, *, now: bool = False) -> None:
    """Mark the memory of a freed ``block``, of any kind: from now on every use of a simulator
    array over it from the host raises :class:`ReleasedError` (a numpy array of a host kind cannot
    refuse, but copies refuse it); once the block's stream reaches the free (at once with ``now``,
    for a block of no stream or a lost context), it is filled with ``0xFF`` (NaN in floats) and
    work an engine runs on it fails too (see :func:`check_live`)."""
    data = block.handle
    if isinstance(data, np.ndarray) and data.size:
        _RELEASED[id(data)] = data
        held = weakref.ref(data)  # the free holds no memory: only arrays over it do (SimState.linger)

        def freed() -> None:
            memory = held()
            if memory is not None:
                memory.fill(0xFF)
                _FREED[id(memory)] = memory

        stream = block.stream
        if now or not isinstance(stream, SimStream):
            freed()
        else:  # a closed stream's worker still runs what was queued before the close
            stream.when_done(freed)


def check_live(data: np.ndarray[Any, Any]) -> None:
    """Raise :class:`ReleasedError` if ``data`` views the memory of a released block.

    From the host that is as soon as the block was given back; on a stream's worker (a copy, a
    fill or a kernel the engines run) once its free ran: work queued on the block's stream
    before the free is ordered before it, as on a GPU.
    """
    base = data.base
    if base is not None and _RELEASED.get(id(base)) is base:
        if on_worker() and _FREED.get(id(base)) is not base:
            return
        if _SPILLED.get(id(base)) is base:
            raise SpilledError(
                f"this {data.shape} {data.dtype} array was spilled to host memory and is touched outside "
                "`async with response.use()`: on a GPU that is undefined. Use the arrays `use()` hands out"
            )
        raise ReleasedError(
            f"this {data.shape} {data.dtype} array was released (mgr.release, free, free_all, the end of "
            "its request's `async with`, its manager's exit, or a context reset) and is used after: on a "
            "GPU its memory may hold another array's data by now. Keep the response until you are done "
            "with its arrays, or request them again"
        )


_DEVICE, _MANAGED = MemoryKind.DEVICE, MemoryKind.MANAGED  # MemoryKind.uses_vram costs 0.3 us a call


@attrs.define(eq=False)
class SimState:
    """The simulated device's memory, shared by its resources (a reset empties it).

    ``used``: device-side bytes of blocks handed out, those a pool caches included (as the
    driver counts them); ``cached``: sizes of the device blocks the pool caches; ``pooled``: bytes
    of the pool's blocks in use; ``live``: the blocks handed out and not given back, by id;
    ``pinned``: the page-locked host buffers; ``device_used``: bytes of ``device`` blocks handed out (what a
    device pool counts in use: managed blocks are not pool memory).

    ``lingering``: bytes of device blocks given back while an array over them is still alive: a
    GPU's pool has them in use until the last holder goes (a CuPy pointer or a cuda.core buffer
    frees its memory when collected), so :meth:`~SimMemory.pool_facts` counts them in use.
    """

    total: int
    reserved: int = 0
    used: int = 0
    device_used: int = 0
    cached: list[int] = attrs.Factory(list)
    pooled: int = 0
    live: dict[int, Block] = attrs.Factory(dict)
    pinned: weakref.WeakValueDictionary[int, np.ndarray[Any, Any]] = attrs.Factory(weakref.WeakValueDictionary)
    lingering: int = 0
    # (generation, bytes) of lingering blocks whose last holder went, settled on the next reading (a
    # finalizer may run in any thread, in the middle of any statement: it only appends)
    _unheld: collections.deque[tuple[int, int]] = attrs.Factory(collections.deque)
    _generation: int = 0  # a reset's blocks are gone with their context: their finalizers count for nothing

    @property
    def free(self) -> int:
        """Device bytes no block holds (cached ones are held)."""
        return self.total - self.used - self.reserved

    def linger(self, block: Block) -> None:
        """Device ``block`` was given back: count it in the pool's use until no array over it is left."""
        data = block.handle
        if block.kind is _DEVICE and isinstance(data, np.ndarray) and data.size:
            self.lingering += block.nbytes
            weakref.finalize(data, self._unheld.append, (self._generation, block.nbytes))

    def settle(self) -> int:
        """The lingering bytes, once those whose last holder went since the last reading are let go."""
        unheld = self._unheld
        while unheld:
            generation, nbytes = unheld.popleft()
            if generation == self._generation:
                self.lingering -= nbytes
        return self.lingering

    def clear(self) -> None:
        """Forget every block: the context that held them is gone."""
        self._generation += 1
        self._unheld.clear()
        self.lingering = 0
        self.used = self.pooled = self.device_used = 0
        self.cached.clear()
        for block in self.live.values():
            poison(block, now=True)
        self.live.clear()


def host_memory(nbytes: int, kind: MemoryKind) -> np.ndarray[Any, Any]:
    """Uninitialised numpy bytes for a block; the host running out is an AllocationError."""
    try:
        return np.empty(nbytes, np.uint8)
    except MemoryError as exc:  # numpy's: the host has not that much memory
        raise AllocationError(
            f"out of host memory: cannot hold {nbytes} bytes of {MemoryKind(kind).value} memory in this "
            "simulator's process; ask for less"
        ) from exc


class SimMemory(MemoryResource):
    """The simulated device's memory: every block fresh, device-side ones counted against the total.

    Parameters
    ----------
    state : SimState
        The device's memory.
    name : str
        The resource name it stands for (``"driver"``, ``"numba"``, or the upstream of a pool).
    """

    def __init__(self, state: SimState, name: str) -> None:
        self.state = state
        self.name = name

    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        state = self.state
        vram = kind is _DEVICE or kind is _MANAGED
        if vram and nbytes > state.free:
            cached = sum(state.cached)
            raise OutOfMemoryError(
                f"out of memory: asked for {nbytes} bytes of {kind.value} memory with {state.free} of "
                f"{state.total} free on the device and {cached} cached in the pool (largest block "
                f"{max(state.cached, default=0)})"
            )
        data = host_memory(nbytes, kind)
        block = Block(id(data) if nbytes else 0, nbytes, kind, stream, data)  # a stand-in address: reading
        if kind is MemoryKind.PINNED:  # the real one (data.ctypes.data) costs 2 us an allocation
            state.pinned[id(data)] = data
        if vram:
            state.used += nbytes
            if kind is _DEVICE:
                state.device_used += nbytes
        state.live[id(block)] = block
        return block

    def deallocate(self, block: Block) -> None:
        state = self.state
        if state.live.pop(id(block), None) is not block:
            raise BackendError(
                f"{block.nbytes}-byte {block.kind.value} block given back twice, or after a context reset: "
                "on a GPU that frees memory another array may be using"
            )
        if block.kind is _DEVICE or block.kind is _MANAGED:
            state.used -= block.nbytes
            if block.kind is _DEVICE:
                state.device_used -= block.nbytes
            state.linger(block)
        poison(block)

    def release_cached(self) -> int:
        return 0

    def pool_facts(self) -> PoolFacts:
        """The device's stream-ordered pool as the driver's model: every device block, whoever holds it."""
        used = self.state.device_used + self.state.settle()
        return PoolFacts(held=used, in_use=used, largest_free=0)


class SimPool(ResourceAdaptor):
    """CuPy's pools (``cupy``, ``cupy_async``) as an adaptor: freed device blocks stay cached.

    A cached block serves a device request of its size or smaller (the smallest that fits;
    the rest stays cached), so a pool can hold free bytes yet fail a larger request. The model
    keeps sizes, not memory: each block it hands out is fresh memory, so an array's data never
    changes under it (on a GPU the array keeps its block alive).

    Parameters
    ----------
    upstream : SimMemory
        The device's memory (the pool's cached sizes are kept in its state).
    name : str
        The resource name it stands for.
    """

    def __init__(self, upstream: SimMemory, name: str) -> None:
        super().__init__(upstream)
        self.memory = upstream
        self.name = name

    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        if kind is not _DEVICE or not nbytes:
            return self.memory.allocate(nbytes, kind, stream)
        state = self.memory.state
        fits = [size for size in state.cached if size >= nbytes]
        if not fits:
            block = self.memory.allocate(nbytes, kind, stream)
        else:
            size = min(fits)
            state.cached.remove(size)
            if size > nbytes:
                state.cached.append(size - nbytes)
            data = host_memory(nbytes, kind)
            block = Block(id(data), nbytes, kind, stream, data)
            state.live[id(block)] = block
        state.pooled += nbytes
        return block

    def deallocate(self, block: Block) -> None:
        if block.kind is not _DEVICE or not block.nbytes:
            self.memory.deallocate(block)
            return
        state = self.memory.state
        if state.live.pop(id(block), None) is not block:
            raise BackendError(
                f"{block.nbytes}-byte device block given back to the pool twice, or after a context reset: "
                "on a GPU that frees memory another array may be using"
            )
        state.pooled -= block.nbytes
        state.cached.append(block.nbytes)  # the pool keeps it for reuse
        state.linger(block)
        poison(block)

    def release_cached(self) -> int:
        state = self.memory.state
        freed = sum(state.cached)
        state.cached.clear()
        state.used -= freed
        return freed

    def pool_facts(self) -> PoolFacts:
        state = self.memory.state
        cached = state.cached
        return PoolFacts(
            held=state.pooled + sum(cached), in_use=state.pooled + state.settle(), largest_free=max(cached, default=0)
        )


class SimShared(ResourceAdaptor, SharedPool):
    """RMM's model (``rmm``): the device's memory, shared with other libraries drawing from the same pool.

    Other libraries' allocations (:meth:`SimulatorBackend.library_allocate`) go through it as
    RMM's hooks send CuPy's, numba's and torch's through the device's current RMM resource; one
    that finds no room calls the failure handler (aiocubie's recovery) and tries again while it
    says it freed something.
    """

    def __init__(self, upstream: SimMemory) -> None:
        super().__init__(upstream)
        self.memory = upstream
        self._handler: Any = None  # a weak reference: the device outlives the manager that set it
        self.routed = threading.local()  # .pool: the library pool the thread's allocations go to
        self.owners: dict[int, SimLibraryPool] = {}  # block id -> the library pool that holds it
        self.limit: int | None = None  # RMM's LimitingResourceAdaptor over what other libraries hold
        self.capped: dict[int, int] = {}  # block id -> bytes, of the blocks allocated under the cap

    def set_failure_handler(self, handler: FailureHandler | None) -> None:
        if handler is None:
            self._handler = None
        else:
            self._handler = weakref.WeakMethod(handler) if hasattr(handler, "__self__") else weakref.ref(handler)

    @property
    def handler(self) -> FailureHandler | None:
        """The failure handler set (None: none, or its manager is gone)."""
        return None if self._handler is None else self._handler()

    def share_with(self, libraries: Sequence[str], limit: int | None = None) -> None:
        for library in libraries:
            if library not in ("cupy", "numba", "torch"):
                raise ConfigurationError(
                    f"cannot share the pool with {library!r}: mgr.pool.share knows 'cupy', 'numba', 'torch'"
                )
        if limit is not None:
            if self.limit is not None and self.limit != limit:
                raise ConfigurationError(
                    f"other libraries are capped at {self.limit} bytes already: the cap is set once ({limit} asked)"
                )
            self.limit = limit

    def allocate_for_library(self, nbytes: int) -> Block:
        """Device bytes for another library, through the failure handler (RMM's failure callback);
        into the thread's library pool while one is entered (torch's ``use_mem_pool``)."""
        if self.limit is not None and sum(self.capped.values()) + nbytes > self.limit:
            raise OutOfMemoryError(  # the limiting adaptor is above the failure callback: no handler runs
                f"out of memory: {nbytes} bytes more would exceed the {self.limit}-byte cap on other libraries"
            )
        while True:
            try:
                block = self.upstream.allocate(nbytes, _DEVICE, None)
                break
            except OutOfMemoryError:
                handler = self.handler
                if handler is None or not handler(nbytes):
                    raise
        if self.limit is not None:
            self.capped[id(block)] = nbytes
        pool = getattr(self.routed, "pool", None)
        if pool is not None:
            pool.bytes += nbytes
            self.owners[id(block)] = pool
        return block

    def free_for_library(self, block: Block) -> None:
        """Give back a block :meth:`allocate_for_library` handed out."""
        pool = self.owners.pop(id(block), None)
        if pool is not None:
            pool.bytes -= block.nbytes
        self.capped.pop(id(block), None)
        self.upstream.deallocate(block)

    def library_pool(self, library: str) -> LibraryPool:
        if library != "torch":
            raise ConfigurationError(f"no pool for {library!r}: only torch's allocations are counted per component")
        return SimLibraryPool(self)


class SimLibraryPool(LibraryPool):
    """torch's ``MemPool`` model: while entered, the thread's library allocations are counted in it."""

    def __init__(self, shared: SimShared) -> None:
        self.shared = shared
        self.bytes = 0
        self._previous: list[SimLibraryPool | None] = []

    def __enter__(self) -> None:
        routed = self.shared.routed
        self._previous.append(getattr(routed, "pool", None))
        routed.pool = self

    def __exit__(self, *exc: object) -> None:
        self.shared.routed.pool = self._previous.pop()

    def held(self) -> int:
        return self.bytes


class SimFaults(ResourceAdaptor):
    """The injected allocation faults (sites ``"allocate"`` and ``"oom"``), before anything is taken.

    Parameters
    ----------
    upstream : MemoryResource
        The resource the faults guard.
    faults : Faults
        The simulator's rules.
    """

    def __init__(self, upstream: MemoryResource, faults: Faults) -> None:
        super().__init__(upstream)
        self.faults = faults

    def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> Block:
        if self.faults.check("allocate"):
            raise AllocationError(f"injected fault: allocating {nbytes} bytes of {kind.value} memory")
        if self.faults.check("oom"):
            raise OutOfMemoryError(f"injected out of memory: allocating {nbytes} bytes of {kind.value} memory")
        return self.upstream.allocate(nbytes, kind, stream)
