"""The facade: MemoryManager, and the process-wide default manager.

It holds the registry, budget, stream groups and ledger, owns the group schedulers' tasks
(``async with MemoryManager() as mgr``), and turns ``await mgr.request(...)`` into tickets.
It never imports numba.cuda or cupy: the device is reached only through the backend.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Hashable, Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import attrs
import numpy as np

from ._backends import Advice, Backend, MemoryInfo, create_backend
from ._budget import Budget, LimitMode, group_available
from ._completion import wait_event
from ._errors import (
    AiocubieWarning,
    BudgetError,
    ConfigurationError,
    ContextResetError,
    InsufficientMemoryError,
    InvalidRequestError,
    ManagerStateError,
    RegistrationError,
    ReleasedError,
)
from ._ledger import Allocation, Ledger
from ._planner import ChunkPlan, offered_bytes, plan_batch, run_length
from ._requests import ArrayRequest, ArrayResponse, MemoryKind, check_requests
from ._scheduler import GroupScheduler, Policy, State, Ticket, allocate_batch
from ._stats import Counters, Snapshot, UsageStats

__all__ = ["MemoryManager", "PendingRequest", "default_manager"]

log = logging.getLogger("aiocubie")

InvalidateHook = Callable[[], Any]
ReadyHook = Callable[[ArrayResponse], Any]


@attrs.frozen
class Options:
    """Scheduler options of a manager (see :class:`MemoryManager`)."""

    batch_window: float
    max_batch: int | None
    headroom: float
    free_cache_seconds: float


@attrs.define(eq=False)
class _Member:
    key: int
    name: str
    group: str
    keepalive: object  # the instance itself when it cannot be weakly referenced, else None
    invalidate_hook: InvalidateHook | None
    ready_hook: ReadyHook | None
    finalizer: weakref.finalize | None  # type: ignore[type-arg]


@attrs.define(eq=False)
class _Group:
    name: str
    stream: Any
    members: set[int] = attrs.field(factory=set)
    scheduler: GroupScheduler | None = None


class PendingRequest:
    """An allocation request: await it for an :class:`ArrayResponse`, or use ``async with``.

    ``async with mgr.request(obj, {...}) as response:`` frees the arrays on exit. Cancelling
    the awaiting task withdraws a queued request and frees an allocated one.
    """

    def __init__(self, manager: MemoryManager, instance: object, requests: dict[str, ArrayRequest]) -> None:
        self._mgr = manager
        self._instance = instance
        self._requests = requests
        self._response: ArrayResponse | None = None
        self._awaited = False

    def __await__(self) -> Generator[Any, None, ArrayResponse]:
        return self._get().__await__()

    async def _get(self) -> ArrayResponse:
        if self._awaited:
            raise ManagerStateError("a request can be awaited only once: call mgr.request() again")
        self._awaited = True
        ticket = self._mgr._submit(self._instance, self._requests)
        try:
            await ticket.done.wait()
        except BaseException:
            self._mgr._cancel(ticket)
            raise
        if ticket.error is not None:
            raise ticket.error
        assert ticket.response is not None
        self._response = ticket.response
        return ticket.response

    async def __aenter__(self) -> ArrayResponse:
        return await self._get()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._response is not None:
            self._mgr.release(self._response)


class MemoryManager:
    """Coordinates the device memory and streams of the components of one program.

    Components register once, then ``await mgr.request(component, {label: ArrayRequest})``.
    Requests of one stream group are batched, planned together (one chunk plan along the
    run axis), allocated on the group's stream and resolved when the device is done.

    Parameters
    ----------
    backend : {"auto", "simulator", "cuda"} or Backend
        ``"auto"`` uses the GPU when there is a usable one and the simulator otherwise.
    mode : {"passive", "active"}
        Passive: use free memory, chunk only when needed. Active: each group is limited to
        the sum of its members' caps minus what they hold.
    policy : {"chunk", "wait", "fail"}
        What an active-mode batch does when it does not fit now (see :class:`Policy`).
    headroom : float
        Fraction of the available memory a batch leaves unused, in [0, 1).
    batch_window : float
        Seconds a batch stays open after its first request (0: close at once). A batch
        closes early when every member of the group has asked, or on :meth:`flush`.
    max_batch : int, optional
        Most requests in one batch.
    free_cache_seconds : float
        How long a free-memory reading is reused (it costs tens of microseconds on a GPU);
        a batch about to be chunked always reads the device again.
    allocator : {"default", "cupy", "cupy_async"}, optional
        Allocator plugin to start with.

    Examples
    --------
    >>> async def main():
    ...     async with MemoryManager(backend="simulator") as mgr:
    ...         solver = object()
    ...         mgr.register(solver, stream_group="solve")
    ...         req = {"state": ArrayRequest((8, 1000), "float32", chunk_axis=1)}
    ...         async with mgr.request(solver, req) as response:
    ...             return response.chunked_shapes
    >>> anyio.run(main)
    {'state': (8, 1000)}
    """

    def __init__(
        self,
        backend: str | Backend = "auto",
        *,
        mode: LimitMode | str = "passive",
        policy: Policy | str = "chunk",
        headroom: float = 0.05,
        batch_window: float = 0.002,
        max_batch: int | None = None,
        free_cache_seconds: float = 0.05,
        allocator: str | None = None,
    ) -> None:
        if not (isinstance(headroom, (int, float)) and 0.0 <= headroom < 1.0):
            raise ConfigurationError(f"headroom must be in [0, 1), got {headroom!r}")
        for name, value in (("batch_window", batch_window), ("free_cache_seconds", free_cache_seconds)):
            if not (isinstance(value, (int, float)) and 0.0 <= value < math.inf):
                raise ConfigurationError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if max_batch is not None and (not isinstance(max_batch, int) or max_batch < 1):
            raise ConfigurationError(f"max_batch must be a positive integer or None, got {max_batch!r}")
        self.options = Options(float(batch_window), max_batch, float(headroom), float(free_cache_seconds))
        self._mode = self._parse_mode(mode)
        self.policy = self._parse_policy(policy)
        if not isinstance(backend, (str, Backend)):
            raise ConfigurationError(
                f"backend must be a name ('auto', 'simulator', 'cuda') or a Backend, got {backend!r}"
            )
        if allocator is not None and not isinstance(allocator, str):
            raise ConfigurationError(f"allocator must be a name or None, got {allocator!r}")
        self._owns_backend = not isinstance(backend, Backend)
        self.backend: Backend = create_backend(backend, allocator=allocator) if isinstance(backend, str) else backend
        if allocator is not None and not self._owns_backend and allocator != self.backend.allocator:
            self.backend.set_allocator(allocator)
        self._budget = Budget(self.backend.memory_info().total)
        self._members: dict[int, _Member] = {}
        self._groups: dict[str, _Group] = {}
        self._ledger = Ledger()
        self._dead: deque[int] = deque()  # keys of collected instances, reaped on the loop thread
        self._task_group: anyio.abc.TaskGroup | None = None
        self._group_counters: dict[str, Counters] = {}
        self._member_counters: dict[str, Counters] = {}
        self._free_reading = 0
        self._free_at = -math.inf
        self._free_delta = 0  # VRAM we allocated (+) or released (-) since the reading
        self._names = 0

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> MemoryManager:
        if self._task_group is not None:
            raise ManagerStateError("this manager is already running")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        for group in self._groups.values():
            self._start_scheduler(group)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None

    async def aclose(self) -> None:
        """Stop the schedulers, fail what is still pending, and free every array."""
        task_group, self._task_group = self._task_group, None
        if task_group is None:
            return
        closed = ManagerStateError("the memory manager was closed before the request was served")
        for group in self._groups.values():
            if group.scheduler is not None:
                group.scheduler.close(closed)
                group.scheduler = None
        task_group.cancel_scope.cancel()
        await task_group.__aexit__(None, None, None)
        self.free_all()

    def close(self) -> None:
        """Release the backend's resources (streams, threads) if this manager created it."""
        if self._task_group is not None:
            raise ManagerStateError("close() on a running manager: leave its `async with` first")
        if self._owns_backend:
            self.backend.close()

    @property
    def running(self) -> bool:
        """True inside ``async with mgr``."""
        return self._task_group is not None

    # -- registration ----------------------------------------------------------------------
    def register(
        self,
        instance: object,
        *,
        proportion: float | None = None,
        stream_group: str = "default",
        invalidate_hook: InvalidateHook | None = None,
        ready_hook: ReadyHook | None = None,
        name: str | None = None,
    ) -> None:
        """Register ``instance``: give it a VRAM budget and a stream group.

        Parameters
        ----------
        instance : object
            The component; held weakly where it allows it, and unregistered (its arrays freed)
            when it is garbage-collected.
        proportion : float, optional
            Share of VRAM in (0, 1] (manual pool); omitted, it joins the auto pool.
        stream_group : str
            Instances of one group share a stream and are batched together.
        invalidate_hook : callable, optional
            Called with no argument on a context reset (set_allocator, invalidate_all).
        ready_hook : callable, optional
            Called with each ArrayResponse of the group's batches: a plain function in the
            loop thread as the batch resolves, an ``async def`` function as a task of its own.
        name : str, optional
            Name in stats and logs (default: the type name and a number).

        Raises
        ------
        RegistrationError
            If ``instance`` is already registered, or a hook is not callable or the group
            name not a non-empty string.
        BudgetError
            If ``proportion`` is outside (0, 1] or does not fit the budget.
        """
        self._reap()
        key = id(instance)
        if key in self._members:
            raise RegistrationError(f"{self._members[key].name} is already registered")
        self._check_group_name(stream_group)
        for label, hook in (("invalidate_hook", invalidate_hook), ("ready_hook", ready_hook)):
            if hook is not None and not callable(hook):
                raise RegistrationError(f"{label} must be callable, got {hook!r}")
        if name is not None and not isinstance(name, str):
            raise RegistrationError(f"name must be a string, got {name!r}")
        if name is not None and any(m.name == name for m in self._members.values()):
            raise RegistrationError(f"the name {name!r} is taken by another registered instance: pick another")
        self._budget.add(key, proportion)  # validates first: nothing is half-registered
        self._names += 1
        try:
            finalizer: weakref.finalize | None = weakref.finalize(instance, self._dead.append, key)  # type: ignore[type-arg]
            keepalive = None
        except TypeError:  # not weak-referenceable: hold it, so no other object takes its id
            finalizer, keepalive = None, instance
        member = _Member(
            key,
            name or f"{type(instance).__name__}#{self._names}",
            stream_group,
            keepalive,
            invalidate_hook,
            ready_hook,
            finalizer,
        )
        self._members[key] = member
        self._member_counters.setdefault(member.name, Counters())
        self._ensure_group(stream_group).members.add(key)

    def unregister(self, instance: object) -> None:
        """Forget ``instance``: free its arrays, withdraw its queued requests, drop its budget."""
        self._reap()
        self._unregister(self._member(instance).key)

    def is_registered(self, instance: object) -> bool:
        """True if ``instance`` is registered."""
        self._reap()
        return id(instance) in self._members

    def _unregister(self, key: int) -> None:
        member = self._members.pop(key)
        if member.finalizer is not None:
            member.finalizer.detach()
        group = self._groups[member.group]
        group.members.discard(key)
        self._budget.remove(key)
        gone = RegistrationError(f"{member.name} was unregistered before its request was served")
        for each in self._groups.values():  # queued requests stay in the group they were made in
            if each.scheduler is None:
                continue
            for ticket in each.scheduler.pending():
                if ticket.key == key:
                    each.scheduler.cancel(ticket)
                    # cancel() marks it cancelled, so fail() would do nothing: wake its awaiter here
                    ticket.error = gone
                    ticket.done.set()
        self._free(self._ledger.pop_where(lambda a: a.key == key))
        # the id may be reused by a new instance: keep the peak under the name, forget the id
        counters = self._member_counters[member.name]
        counters.peak_bytes = max(counters.peak_bytes, self._ledger.forget(key))
        self._changed()  # caps changed, and an open batch may no longer wait for this member

    def _reap(self) -> None:
        while self._dead:
            key = self._dead.popleft()
            if key in self._members:
                log.debug("unregistering collected %s", self._members[key].name)
                self._unregister(key)

    def _member(self, instance: object) -> _Member:
        self._reap()
        member = self._members.get(id(instance))
        if member is None:
            raise RegistrationError(
                f"{type(instance).__name__} object at {id(instance):#x} is not registered: "
                "call mgr.register(instance) first"
            )
        return member

    # -- budget ----------------------------------------------------------------------------
    @property
    def mode(self) -> LimitMode:
        """``passive`` or ``active``."""
        return self._mode

    @property
    def active(self) -> bool:
        """True in active mode."""
        return self._mode is LimitMode.ACTIVE

    def set_limit_mode(self, mode: LimitMode | str) -> None:
        """Switch between ``"passive"`` and ``"active"``."""
        self._mode = self._parse_mode(mode)
        self._changed()

    def set_policy(self, policy: Policy | str) -> None:
        """Set the active-mode policy: ``"chunk"``, ``"wait"`` or ``"fail"``."""
        self.policy = self._parse_policy(policy)
        self._changed()

    def proportion(self, instance: object) -> float:
        """Share of VRAM ``instance`` may use."""
        return self._budget.proportion(self._member(instance).key)

    def cap(self, instance: object) -> int:
        """Bytes ``instance`` may use: proportion x total VRAM."""
        return self._budget.cap(self._member(instance).key)

    @property
    def manual_pool_proportion(self) -> float:
        """Share of VRAM assigned to manual members."""
        return self._budget.manual_pool_proportion

    @property
    def auto_pool_proportion(self) -> float:
        """Share of VRAM split among auto members."""
        return self._budget.auto_pool_proportion

    def set_manual_proportion(self, instance: object, proportion: float) -> None:
        """Give ``instance`` a manual ``proportion`` (moving it out of the auto pool)."""
        self._budget.set_manual(self._member(instance).key, proportion)
        self._changed()

    def set_manual_limit_mode(self, instance: object, proportion: float) -> None:
        """Move ``instance`` from the auto pool to the manual pool with ``proportion``.

        Raises
        ------
        BudgetError
            If ``instance`` already has a manual proportion.
        """
        key = self._member(instance).key
        if self._budget.is_manual(key):
            raise BudgetError(
                f"{self._members[key].name} is already in the manual pool: use set_manual_proportion"
            )
        self._budget.set_manual(key, proportion)
        self._changed()

    def set_auto_limit_mode(self, instance: object) -> None:
        """Move ``instance`` from the manual pool to the auto pool."""
        self._budget.set_auto(self._member(instance).key)
        self._changed()

    def get_available_memory(self, group: str) -> int:
        """Bytes ``group`` may use now (warns above 95% use in active mode)."""
        self._reap()
        members = self._group(group).members
        return group_available(
            self._mode,
            free=self._free_memory(fresh=True),
            group_cap=self._budget.group_cap(members),
            group_held=self._ledger.held(members),
            group=group,
        )

    def memory_info(self) -> MemoryInfo:
        """Free and total device memory, read now."""
        return self.backend.memory_info()

    # -- stream groups ---------------------------------------------------------------------
    def get_stream(self, instance: object) -> Any:
        """The stream of ``instance``'s group."""
        return self._groups[self._member(instance).group].stream

    def get_stream_group(self, instance: object) -> str:
        """The name of ``instance``'s stream group."""
        return self._member(instance).group

    def change_stream_group(self, instance: object, new_group: str) -> None:
        """Move ``instance`` to ``new_group`` (created if new).

        Its queued requests move with it; those already being planned or in flight finish in
        the old group.
        """
        member = self._member(instance)
        self._check_group_name(new_group)
        old = self._groups[member.group]
        old.members.discard(member.key)
        member.group = new_group
        new = self._ensure_group(new_group)
        new.members.add(member.key)
        if old.scheduler is not None and new.scheduler is not None and old is not new:
            for ticket in [t for t in old.scheduler.queue if t.key == member.key]:
                old.scheduler.queue.remove(ticket)
                ticket.group = new_group
                new.scheduler.submit(ticket)
        self._changed()

    def is_grouped(self, instance: object) -> bool:
        """True if ``instance`` shares its stream group with another instance."""
        return len(self._groups[self._member(instance).group].members) > 1

    @property
    def stream_groups(self) -> dict[str, list[str]]:
        """Group name -> names of its members."""
        self._reap()  # a collected instance is no member
        return {
            name: sorted(self._members[key].name for key in group.members)
            for name, group in self._groups.items()
        }

    def reinit_streams(self) -> None:
        """Give every group a new stream (after a context reset)."""
        for group in self._groups.values():
            group.stream = self.backend.create_stream()

    # -- requests --------------------------------------------------------------------------
    def request(self, instance: object, requests: Mapping[str, ArrayRequest]) -> PendingRequest:
        """Ask for arrays: ``await`` the result, or ``async with`` it to free them on exit.

        The requests are checked now (bad ones raise at once); they are queued when awaited.

        Parameters
        ----------
        instance : object
            A registered instance.
        requests : mapping
            Label -> :class:`ArrayRequest`.

        Returns
        -------
        PendingRequest
            Resolves to an :class:`ArrayResponse`.

        Raises
        ------
        InvalidRequestError
            For a malformed mapping, or arrays of one request that disagree on the run length.
        RegistrationError
            If ``instance`` is not registered.
        PlanningError, AllocationError, ContextResetError, ManagerStateError
            When awaited, if the batch could not be served.
        """
        checked = check_requests(requests)
        self._member(instance)
        run_length(checked.items())  # the arrays of one request must agree at once
        return PendingRequest(self, instance, checked)

    def flush(self, group: str | None = None) -> None:
        """Close the batch being collected in ``group`` (all groups if None) now."""
        groups = self._groups.values() if group is None else [self._group(group)]
        for each in groups:
            if each.scheduler is not None:
                each.scheduler.flush()

    def allocate_all(self, instance: object, requests: Mapping[str, ArrayRequest]) -> ArrayResponse:
        """Allocate ``requests`` for ``instance`` now, unbatched and unchunked, on its stream.

        The arrays are usable after ``await mgr.sync_stream(instance)``; release them with
        :meth:`release`, :meth:`free` or :meth:`free_all`. Works without ``async with``.

        Raises
        ------
        InsufficientMemoryError
            If the arrays do not fit whole in what the instance's group is offered.
        AllocationError
            If the backend fails (nothing stays allocated).
        """
        checked = check_requests(requests)
        member = self._member(instance)
        free = self._free_memory(fresh=True)
        plan = plan_batch({0: checked}, self._offered(member.group, free), free=free)
        if plan.chunks > 1:
            raise InsufficientMemoryError(
                f"allocate_all needs {plan.full_bytes} bytes whole but group {member.group!r} is "
                f"offered {plan.offered}: use await mgr.request() to have it chunked"
            )
        stream = self._groups[member.group].stream
        (allocations,), _ = allocate_batch(self.backend, member.group, [(member.key, checked)], plan, stream)
        return self._respond(checked, allocations, plan, stream)

    def allocate(self, instance: object, request: ArrayRequest, label: str = "array") -> Any:
        """Allocate one array for ``instance`` now (see :meth:`allocate_all`)."""
        return self.allocate_all(instance, {label: request}).arrays[label]

    # -- release ---------------------------------------------------------------------------
    def release(self, response: ArrayResponse) -> None:
        """Free the arrays of ``response``. Idempotent."""
        self._release_response(response)

    def free(self, label: str) -> None:
        """Free every array labelled ``label``, whichever instance holds it.

        Requests still in flight whose arrays are freed fail with :class:`ReleasedError`
        (and the rest of their arrays are freed too).
        """
        self._free_where(lambda a: a.label == label, f"free({label!r})")

    def free_all(self) -> None:
        """Free every array the manager handed out (requests in flight fail with ReleasedError)."""
        self._free_where(lambda a: True, "free_all()")

    def _free_where(self, predicate: Callable[[Allocation], bool], cause: str) -> None:
        allocations = self._ledger.pop_where(predicate)
        self._free(allocations)
        owners = {id(a.owner) for a in allocations}
        if owners:
            error = ReleasedError(f"{cause} freed this request's arrays before it resolved; request again")
            for group in self._groups.values():
                if group.scheduler is not None:
                    for response in group.scheduler.fail_in_flight(owners, error):
                        self._release_response(response)

    def invalidate_all(self) -> None:
        """Call every invalidate hook once and release every array.

        Requests in flight fail with :class:`ContextResetError`; queued ones are served later.
        """
        self._reset("invalidate_all")
        self.free_all()
        self._call_invalidate_hooks()

    def set_allocator(self, name: str) -> None:
        """Swap the allocator plugin (``"default"``, ``"cupy"``, ``"cupy_async"``).

        The swap resets the device context: every array handed out before is invalid,
        requests in flight fail with :class:`ContextResetError`, every invalidate hook is
        called once, and every group gets a new stream. Queued requests are served on the
        new context.

        Raises
        ------
        UnknownAllocatorError
            For an unknown or unavailable allocator (nothing is reset then).
        """
        self.backend.set_allocator(name)  # first: an unknown name must not warn of a reset
        warnings.warn(
            f"set_allocator({name!r}) resets the device context: arrays and compiled kernels "
            "from before are invalid",
            AiocubieWarning,
            stacklevel=2,
        )
        self._reset(f"set_allocator({name!r})")
        self._ledger.pop_where(lambda a: True)  # the context that held them is gone
        self._free_delta = 0
        self._free_at = -math.inf
        self.reinit_streams()
        self._call_invalidate_hooks()

    # -- host arrays, copies, streams, managed memory -------------------------------------
    def create_host_array(
        self,
        shape: int | Sequence[int],
        dtype: Any,
        kind: MemoryKind | str = "pinned",
        like: np.ndarray[Any, Any] | None = None,
    ) -> np.ndarray[Any, Any]:
        """A C-contiguous host array, ``pinned`` or ``host``: zeros, or a copy of ``like``."""
        request = ArrayRequest(shape, dtype, kind, unchunkable=True)
        if request.kind not in (MemoryKind.PINNED, MemoryKind.HOST):
            raise InvalidRequestError(f"host arrays are 'pinned' or 'host', not {request.kind.value!r}")
        array = self.backend.host_array(request.shape, request.dtype, request.kind)
        if like is not None:
            if np.shape(like) != request.shape:
                raise InvalidRequestError(f"like has shape {np.shape(like)}, not {request.shape}")
            try:
                array[...] = like
            except (TypeError, ValueError) as exc:  # text or objects numpy cannot cast
                raise InvalidRequestError(
                    f"like={like!r} cannot be copied into a {request.dtype} host array: {exc}"
                ) from exc
        return array

    async def to_device(self, instance: object, host_arrays: Sequence[Any], device_arrays: Sequence[Any]) -> None:
        """Copy each host array into its device array on ``instance``'s stream; wait until done."""
        await self._copy(instance, host_arrays, device_arrays)

    async def from_device(self, instance: object, device_arrays: Sequence[Any], host_arrays: Sequence[Any]) -> None:
        """Copy each device array into its host array on ``instance``'s stream; wait until done."""
        await self._copy(instance, device_arrays, host_arrays)

    async def _copy(self, instance: object, sources: Sequence[Any], targets: Sequence[Any]) -> None:
        if len(sources) != len(targets):
            raise InvalidRequestError(f"{len(sources)} sources but {len(targets)} targets: pair them up")
        stream = self.get_stream(instance)
        for src, dst in zip(sources, targets):
            self.backend.copy(src, dst, stream)
        await wait_event(self.backend.record_event(stream))

    async def sync_stream(self, instance: object) -> None:
        """Wait until everything queued on ``instance``'s stream is done (without blocking)."""
        await wait_event(self.backend.record_event(self.get_stream(instance)))

    async def prefetch(self, instance: object, array: Any, device: int | None = 0) -> None:
        """Prefetch managed ``array`` to ``device`` (None: the CPU) on ``instance``'s stream."""
        stream = self.get_stream(instance)
        self.backend.prefetch(array, device, stream)
        await wait_event(self.backend.record_event(stream))

    def advise(self, array: Any, advice: Advice, device: int | None = 0) -> None:
        """Give managed-memory ``advice`` (preferred_location, accessed_by, read_mostly)."""
        self.backend.advise(array, advice, device)

    # -- observability ---------------------------------------------------------------------
    def stats(self) -> Snapshot:
        """Live and peak bytes, requests, batches, chunks and latencies, per group and instance."""
        self._reap()
        ledger = self._ledger
        info = self.backend.memory_info()
        groups = {
            name: UsageStats.of(counters, ledger.live_by_group.get(name, 0), ledger.peak_by_group.get(name, 0))
            for name, counters in self._group_counters.items()
        }
        by_name = {m.name: m.key for m in self._members.values()}
        instances = {}
        for name, counters in self._member_counters.items():
            key = by_name.get(name)
            live, peak = ledger.live_by_key.get(key, 0), ledger.peak_by_key.get(key, 0)
            instances[name] = UsageStats.of(counters, live, max(peak, counters.peak_bytes))
        return Snapshot(Snapshot.now(), info.free, info.total, ledger.live, ledger.peak, groups, instances)

    # -- internals used by the scheduler ---------------------------------------------------
    def _submit(self, instance: object, requests: dict[str, ArrayRequest]) -> Ticket:
        if self._task_group is None:
            raise ManagerStateError(
                "the memory manager is not running: use `async with MemoryManager() as mgr:`"
            )
        member = self._member(instance)
        group = self._groups[member.group]
        assert group.scheduler is not None
        ticket = Ticket(member.key, member.group, requests, run_length(requests.items()))
        self._counters(member.group, member.key, "requests")
        group.scheduler.submit(ticket)
        return ticket

    def _cancel(self, ticket: Ticket) -> None:
        group = self._groups.get(ticket.group)
        if group is not None and group.scheduler is not None:
            group.scheduler.cancel(ticket)
        elif ticket.state is State.READY:
            self._release_response(ticket.response)

    def _spawn(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        assert self._task_group is not None
        self._task_group.start_soon(func, *args)

    def _members_of(self, group: str) -> set[int]:
        return self._groups[group].members

    def _stream_of_group(self, group: str) -> Any:
        return self._groups[group].stream

    def _ready_hook(self, key: Hashable) -> ReadyHook | None:
        member = self._members.get(key)  # type: ignore[call-overload]
        return None if member is None else member.ready_hook

    def _name(self, key: Hashable) -> str:
        member = self._members.get(key)  # type: ignore[call-overload]
        return "an unregistered instance" if member is None else member.name

    def _free_memory(self, *, fresh: bool) -> int:
        now = time.monotonic()
        if fresh or now - self._free_at > self.options.free_cache_seconds:
            self._free_reading = self.backend.memory_info().free
            self._free_at, self._free_delta = now, 0
        return self._free_reading - self._free_delta

    def _offered(self, group: str, free: int, *, as_if_empty: bool = False) -> int:
        available = free  # passive mode: caps and holdings do not matter
        if self.active:
            members = self._groups[group].members
            held = self._ledger.held(members)
            if as_if_empty:  # what the group would be offered if its members held nothing
                free, held = free + held, 0
            available = group_available(
                self._mode,
                free=free,
                group_cap=self._budget.group_cap(members),
                group_held=held,
                group=group,
                warn=False,
            )
        return offered_bytes(available, free, headroom=self.options.headroom, granule=self.backend.granule)

    def _respond(
        self, requests: dict[str, ArrayRequest], allocations: list[Allocation], plan: ChunkPlan, stream: Any
    ) -> ArrayResponse:
        """Build the response for ``allocations`` and enter them in the ledger."""
        response = ArrayResponse(
            arrays={a.label: a.array for a in allocations},
            chunks=plan.chunks,
            chunk_length=plan.chunk_length,
            runs=plan.runs,
            chunked_shapes={label: r.chunked_shape(plan.chunk_length) for label, r in requests.items()},
            chunk_axes={label: None if r.unchunkable else r.chunk_axis for label, r in requests.items()},
            stream=stream,
        )
        self._ledger.add(response, allocations)
        self._free_delta += sum(a.vram for a in allocations)
        return response

    def _release_response(self, response: ArrayResponse | None) -> None:
        if response is not None:
            self._free(self._ledger.pop_owner(response))

    def _free(self, allocations: list[Allocation]) -> None:
        for alloc in allocations:
            self.backend.free(alloc.array)
            self._free_delta -= alloc.vram
        # only a batch waiting for memory (active mode, policy "wait") cares: spare waking every group
        if allocations and self.active and self.policy is Policy.WAIT:
            self._changed()

    def _changed(self) -> None:
        for group in self._groups.values():
            if group.scheduler is not None:
                group.scheduler.changed()

    def _reset(self, cause: str) -> None:
        error = ContextResetError(f"{cause} reset the device context while this request was in flight; request again")
        for group in self._groups.values():
            if group.scheduler is not None:
                group.scheduler.reset(error)

    def _call_invalidate_hooks(self) -> None:
        for member in list(self._members.values()):
            if member.invalidate_hook is None:
                continue
            try:
                member.invalidate_hook()
            except Exception:
                log.exception("invalidate hook of %s raised", member.name)

    def _counters(self, group: str, key: Hashable, field: str) -> None:
        for counters in self._counter_pair(group, key):
            setattr(counters, field, getattr(counters, field) + 1)

    def _counter_pair(self, group: str, key: Hashable) -> tuple[Counters, ...]:
        group_counters = self._group_counters.get(group)
        if group_counters is None:  # not setdefault: that would build a Counters on every call
            group_counters = self._group_counters[group] = Counters()
        pair = [group_counters]
        member = self._members.get(key)  # type: ignore[call-overload]
        if member is not None:
            pair.append(self._member_counters[member.name])
        return tuple(pair)

    def _record_wait(self, group: str, key: Hashable, seconds: float) -> None:
        for counters in self._counter_pair(group, key):
            counters.queue_wait.append(seconds)

    def _record_ready(self, group: str, key: Hashable, seconds: float) -> None:
        for counters in self._counter_pair(group, key):
            counters.ready_latency.append(seconds)

    def _record_batch(self, group: str, plan: ChunkPlan, keys: set[Hashable]) -> None:
        counted: set[int] = set()
        for key in keys:
            for counters in self._counter_pair(group, key):
                if id(counters) not in counted:
                    counted.add(id(counters))
                    counters.batches += 1
                    counters.chunks += plan.chunks

    # -- helpers ---------------------------------------------------------------------------
    def _ensure_group(self, name: str) -> _Group:
        group = self._groups.get(name)
        if group is None:
            group = self._groups[name] = _Group(name, self.backend.create_stream())
            self._group_counters.setdefault(name, Counters())
            if self._task_group is not None:
                self._start_scheduler(group)
        return group

    def _start_scheduler(self, group: _Group) -> None:
        assert self._task_group is not None
        group.scheduler = GroupScheduler(self, group.name)
        self._task_group.start_soon(group.scheduler.run, name=f"aiocubie scheduler {group.name!r}")

    def _group(self, name: str) -> _Group:
        self._check_group_name(name)  # an unhashable name would raise TypeError below
        group = self._groups.get(name)
        if group is None:
            known = ", ".join(map(repr, self._groups)) or "none"
            raise RegistrationError(f"no stream group {name!r} (known: {known})")
        return group

    @staticmethod
    def _check_group_name(name: object) -> None:
        if not isinstance(name, str) or not name:
            raise RegistrationError(f"stream group names are non-empty strings, got {name!r}")

    @staticmethod
    def _parse_mode(mode: LimitMode | str) -> LimitMode:
        try:
            return LimitMode(mode)
        except ValueError:
            raise ConfigurationError(f"unknown limit mode {mode!r}: use 'passive' or 'active'") from None

    @staticmethod
    def _parse_policy(policy: Policy | str) -> Policy:
        try:
            return Policy(policy)
        except ValueError:
            raise ConfigurationError(f"unknown policy {policy!r}: use 'chunk', 'wait' or 'fail'") from None


_default: MemoryManager | None = None
_default_lock = threading.Lock()


def default_manager() -> MemoryManager:
    """The process-wide manager (``backend="auto"``), created on first use.

    Like any manager it serves requests inside ``async with default_manager():``.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = MemoryManager()
        return _default

