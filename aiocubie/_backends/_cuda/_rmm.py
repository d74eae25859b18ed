"""The ``rmm`` resource (the rmm extra): aiocubie's device blocks from the device's RMM resource, one pool for all.

:class:`RmmResource` wraps whatever RMM resource the device has (the program's, dask-cuda's, or RMM's
default) in a failure callback and a statistics adaptor, and makes that stack the device's current RMM
resource: every library that draws from RMM (CuPy, numba and torch through RMM's hooks, RAPIDS) is
counted there, and its out-of-memory failures reach aiocubie's recovery. It never replaces the resource
underneath (every byte still comes from it). The only module of aiocubie that imports rmm.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..._errors import ConfigurationError, UnknownAllocatorError
from ..._names import MemoryKind
from .._resource import Block, FailureHandler, LibraryPool, PoolFacts, SharedPool
from ._errors import map_exceptions
from ._resources import CudaResource, DeviceContext
from ._streams import stream_handle

__all__ = ["LIBRARIES", "RMM_EXTRA_HINT", "RmmResource", "import_rmm"]

log = logging.getLogger("aiocubie")

RMM_EXTRA_HINT = 'pip install "aiocubie[rmm]" (rmm-cu13, for CUDA 13)'
#: The libraries :meth:`RmmResource.share_with` can route to the pool, through RMM's own hooks.
LIBRARIES = ("cupy", "numba", "torch")

# Set while aiocubie allocates its own blocks in this thread: their failures recover in the device
# account (a whole batch, retried all or nothing), not in RMM's failure callback.
_OWN = threading.local()


def import_rmm() -> Any:
    """``rmm``, or :class:`UnknownAllocatorError` saying to install the extra."""
    try:
        import rmm
        import rmm.mr
    except ImportError as exc:
        raise UnknownAllocatorError(
            f"allocator 'rmm' needs RMM, which is not importable ({exc}): {RMM_EXTRA_HINT}; or use one of "
            "'driver', 'cupy', 'cupy_async'"
        ) from exc
    return rmm


class _Shared:
    """The stack aiocubie installed over one device's RMM resource; every ``rmm`` resource of the device shares it.

    ``statistics(failure(previous))``: statistics on top counts every allocation that succeeded; the
    failure callback under it runs the handlers of the live resources (other libraries' failures only).
    With a cap on other libraries (:meth:`cap_others`), the device's current resource is a
    ``LimitingResourceAdaptor`` over that stack (``others``); aiocubie's own blocks bypass it.
    """

    def __init__(self, rmm: Any, device_id: int, previous: Any) -> None:
        self.previous = previous
        self.handlers: list[weakref.ref[Any]] = []
        self.failure = rmm.mr.FailureCallbackResourceAdaptor(previous, self._on_failure)
        self.statistics = rmm.mr.StatisticsResourceAdaptor(self.failure)
        self.others: Any = None
        self.limit: int | None = None
        rmm.mr.set_per_device_resource(device_id, self.statistics)

    def installed(self, current: Any) -> bool:
        """Whether ``current`` (the device's current resource) is this stack's top."""
        return current is self.statistics or (self.others is not None and current is self.others)

    def cap_others(self, rmm: Any, device_id: int, limit: int) -> None:
        """Put a ``LimitingResourceAdaptor`` of ``limit`` bytes between other libraries and the pool (once).

        Set once: torch frees through the device's current resource, so a second limiter would be
        told of frees it never counted.
        """
        if self.limit is not None:
            if self.limit != limit:
                raise ConfigurationError(
                    f"other libraries are capped at {self.limit} bytes already: the cap is set once ({limit} asked)"
                )
            return
        self.others = rmm.mr.LimitingResourceAdaptor(self.statistics, limit)
        self.limit = limit
        rmm.mr.set_per_device_resource(device_id, self.others)

    def _on_failure(self, nbytes: int) -> bool:
        """RMM found no room for ``nbytes``: True to try again (a handler freed something)."""
        if getattr(_OWN, "allocating", False):
            return False
        try:
            for ref in list(self.handlers):
                handler = ref()
                if handler is not None and handler(nbytes):
                    return True
        except Exception:  # raised into RMM's C++ it would abort the allocation obscurely: say it here
            log.exception("aiocubie's out-of-memory handler raised for an allocation of %d bytes", nbytes)
        return False


_SHARED: dict[int, _Shared] = {}


def _shared(rmm: Any, device_id: int) -> _Shared:
    """The device's stack: made over its current resource the first time, or when the program installed another since."""
    current = rmm.mr.get_per_device_resource(device_id)
    shared = _SHARED.get(device_id)
    if shared is None or not shared.installed(current):
        shared = _SHARED[device_id] = _Shared(rmm, device_id, current)
    return shared


class RmmResource(CudaResource, SharedPool):
    """Device blocks as ``rmm.DeviceBuffer`` from the device's current RMM resource, on the group's stream.

    Parameters
    ----------
    device : DeviceContext
        The device it allocates on.

    Raises
    ------
    UnknownAllocatorError
        When RMM is not installed (the message says to ``pip install "aiocubie[rmm]"``).

    Notes
    -----
    Its :meth:`pool_facts` are the pool's, not aiocubie's alone: ``in_use`` counts every byte any
    library holds through the device's RMM resource, so the manager's stats show the others' bytes
    (``Snapshot.other_bytes``).
    """

    name = "rmm"

    def __init__(self, device: DeviceContext) -> None:
        super().__init__(device)
        self._rmm = rmm = import_rmm()
        from rmm.pylibrmm.stream import LEGACY_DEFAULT_STREAM, Stream

        self._stream_type, self._legacy = Stream, LEGACY_DEFAULT_STREAM
        with device.activate(), map_exceptions(f"wrapping CUDA device {device.device_id}'s RMM resource"):
            self._shared = _shared(rmm, device.device_id)
        self._top: Any = self._shared.statistics  # what aiocubie's blocks are allocated through
        self._own = True  # aiocubie's own blocks (their failures recover in the account, not the callback)
        self._buffer = rmm.DeviceBuffer
        self._views: dict[int, Any] = {}
        self._handler: weakref.ref[Any] | None = None

    @property
    def upstream(self) -> Any:
        """The RMM resource underneath, as the program (or dask-cuda, or RMM's default) installed it."""
        return self._shared.previous

    def _device_block(self, nbytes: int, stream: Any) -> Block:
        self._device.make_current()  # RMM's resources allocate on the current device
        key = stream_handle(stream)
        view = self._views.get(key)
        if view is None:  # RMM's stream type, made once a stream (it keeps the stream alive)
            view = self._views[key] = self._stream_type(stream) if key else self._legacy
        _OWN.allocating = self._own
        try:
            buffer = self._buffer(size=nbytes, stream=view, mr=self._top)
        finally:
            _OWN.allocating = False
        return Block(int(buffer.ptr), nbytes, MemoryKind.DEVICE, stream, buffer)

    def release_cached(self) -> int:
        """Nothing: RMM's pools give no cached bytes back on request (0)."""
        return 0

    def pool_facts(self) -> PoolFacts:
        """Every byte of the device's RMM pool in use, whoever holds it; held: the pool's size where RMM says it."""
        with map_exceptions("reading RMM's statistics"):
            in_use = int(self._shared.statistics.allocation_counts.current_bytes)
            held = in_use
            pool_size = getattr(self._shared.previous, "pool_size", None)
            if pool_size is not None:  # a PoolMemoryResource keeps what is freed: cached for anyone
                held = max(in_use, int(pool_size()))
        return PoolFacts(held=held, in_use=in_use)

    def set_failure_handler(self, handler: FailureHandler | None) -> None:
        """Run ``handler(nbytes)`` when another library's allocation through the pool fails (held weakly)."""
        handlers = self._shared.handlers
        if self._handler is not None and self._handler in handlers:
            handlers.remove(self._handler)
        self._handler = None
        if handler is not None:
            self._handler = weakref.WeakMethod(handler) if hasattr(handler, "__self__") else weakref.ref(handler)
            handlers.append(self._handler)

    def share_with(self, libraries: Sequence[str], limit: int | None = None) -> None:
        """Route ``libraries``' own allocations to the device's RMM resource (see ``PoolView.share``).

        ``limit``: RMM's ``LimitingResourceAdaptor`` between the other libraries and the pool (set once).

        Raises
        ------
        ConfigurationError
            For a name not in :data:`LIBRARIES`, a library that is not installed, torch after it
            has allocated (torch's allocator can only be swapped before its first allocation), or a
            second, different limit.
        """
        for library in libraries:
            if library not in LIBRARIES:
                raise ConfigurationError(
                    f"cannot share the pool with {library!r}: mgr.pool.share knows {', '.join(map(repr, LIBRARIES))}"
                )
        with self._device.activate():
            if limit is not None:
                with map_exceptions(f"capping other libraries at {limit} bytes"):
                    self._shared.cap_others(self._rmm, self._device.device_id, limit)
            for library in libraries:
                _HOOKS[library](self)

    def for_libraries(self) -> RmmResource:
        """This resource as other libraries draw from it: through the cap on them, if any (numba's plugin)."""
        view = _LimitedRmm.__new__(_LimitedRmm)
        view._copy(self, self._shared.others if self._shared.others is not None else self._top, own=False)
        view.limit = self._shared.limit
        return view

    def library_pool(self, library: str) -> LibraryPool:
        """A ``torch.cuda.MemPool`` on RMM's torch allocator: torch's tensors from the device's RMM resource.

        Raises
        ------
        ConfigurationError
            For a library other than ``"torch"``, or torch missing or without a GPU.
        """
        if library != "torch":
            raise ConfigurationError(f"no pool for {library!r}: only torch's allocations are counted per component")
        torch = _import("torch")
        from rmm.allocators.torch import rmm_torch_allocator

        if rmm_torch_allocator is None:
            raise ConfigurationError("RMM's torch allocator is not available: torch sees no CUDA device")
        with self._device.activate():
            return _TorchPool(torch, torch.cuda.MemPool(rmm_torch_allocator.allocator()), self._device.device_id)


class _LimitedRmm(RmmResource):
    """An ``rmm`` resource as other libraries draw from it (:meth:`RmmResource.for_libraries`): its blocks
    go through the ``LimitingResourceAdaptor`` on them, if any."""

    limit: int | None

    def _copy(self, base: RmmResource, top: Any, *, own: bool) -> None:
        self._device, self._shared, self._handler = base._device, base._shared, None
        self._rmm, self._stream_type, self._legacy = base._rmm, base._stream_type, base._legacy
        self._buffer, self._views, self._top, self._own = base._buffer, base._views, top, own

    def pool_facts(self) -> PoolFacts:
        """The limit as held, the bytes allocated through this view as in use (the pool's facts without a limit)."""
        if self.limit is None:
            return super().pool_facts()
        with map_exceptions("reading RMM's limiting adaptor"):
            return PoolFacts(held=self.limit, in_use=int(self._top.get_allocated_bytes()))


class _TorchPool(LibraryPool):
    """torch's ``MemPool`` on RMM: ``use_mem_pool`` while entered; ``held`` is the sum of its segments."""

    def __init__(self, torch: Any, pool: Any, device_id: int) -> None:
        self._torch, self.pool, self._device_id = torch, pool, device_id
        self._using: list[Any] = []

    def __enter__(self) -> None:
        using = self._torch.cuda.use_mem_pool(self.pool, device=self._device_id)
        using.__enter__()
        self._using.append(using)

    def __exit__(self, *exc: object) -> None:
        self._using.pop().__exit__(*exc)

    def held(self) -> int:
        return sum(int(segment["total_size"]) for segment in self.pool.snapshot())


def _import(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot share the pool with {name}: it is not importable ({exc})") from exc


def _share_cupy(resource: RmmResource) -> None:
    cupy = _import("cupy")
    from rmm.allocators.cupy import rmm_cupy_allocator

    cupy.cuda.set_allocator(rmm_cupy_allocator)


def _share_numba(resource: RmmResource) -> None:
    _import("numba")
    from .._numba import install_memory_manager  # aiocubie's EMM plugin: numba's allocations from this resource

    install_memory_manager(resource._device, resource.for_libraries())


def _share_torch(resource: RmmResource) -> None:
    torch = _import("torch")
    from rmm.allocators.torch import rmm_torch_allocator

    if rmm_torch_allocator is None:
        raise ConfigurationError("RMM's torch allocator is not available: torch sees no CUDA device")
    try:
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    except RuntimeError as exc:
        raise ConfigurationError(
            f"torch cannot draw from the pool now ({exc}): mgr.pool.share('torch') must come before torch's first "
            "CUDA allocation (torch swaps its allocator only before it has allocated)"
        ) from exc


_HOOKS: dict[str, Callable[[RmmResource], None]] = {"cupy": _share_cupy, "numba": _share_numba, "torch": _share_torch}
