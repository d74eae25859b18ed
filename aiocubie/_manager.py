"""The facade: MemoryManager, and the process-wide default manager.

It composes the core (options, device account, registry, telemetry, one scheduler per stream
group), owns the schedulers' tasks (``async with MemoryManager() as mgr``) and delegates each
public call to the component that owns the concept. It never imports numba.cuda or cupy: the
device is reached only through the backend.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from threading import get_ident
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc
import numpy as np

from ._accounting import DeviceAccount, ReclaimHook
from ._backends import ALLOCATORS, BACKENDS, Advice, Backend, MemoryInfo, create_backend, parse_array_type
from ._budget import LimitMode
from ._completion import Loop, wait_event
from ._errors import (
    AiocubieError,
    AllocationError,
    BudgetError,
    ConfigurationError,
    ContextResetError,
    InsufficientMemoryError,
    InvalidRequestError,
    ManagerStateError,
    RegistrationError,
    ReleasedError,
    UnknownAllocatorError,
    shown,
    warn,
)
from ._history import MAX_ENTRIES, History, HistoryRecorder
from ._ledger import Allocation
from ._options import Options, Policy, from_environment, parse_history, parse_mode
from ._planner import plan_chunks
from ._registry import Group, InvalidateHook, Member, ReadyHook, Registry, await_hook, call_hook
from ._requests import ArrayRequest, ArrayResponse, MemoryKind, RequestSet, check_device, check_requests
from ._scheduler import GroupScheduler
from ._stats import PinnedStats, Snapshot, Telemetry, UsageStats, summary
from ._tickets import Ticket

__all__ = ["MemoryManager", "PendingRequest", "default_manager"]

log = logging.getLogger("aiocubie")


class PendingRequest:
    """An allocation request: await it for an :class:`ArrayResponse`, or use ``async with``.

    ``async with mgr.request(obj, {...}) as response:`` frees the arrays on exit. Cancelling
    the awaiting task withdraws a queued request and frees an allocated one.
    """

    __slots__ = ("_awaited", "_instance", "_member", "_mgr", "_replace", "_requests", "_response")

    def __init__(
        self, manager: MemoryManager, instance: object, member: Member, requests: RequestSet, replace: bool = False
    ) -> None:
        self._mgr = manager
        self._instance = instance
        self._member = member
        self._requests = requests
        self._replace = replace
        self._response: ArrayResponse | None = None
        self._awaited = False

    def __await__(self) -> Generator[Any, None, ArrayResponse]:
        if self._awaited:
            raise ManagerStateError("a request can be awaited only once: call mgr.request() again")
        self._awaited = True
        return self._mgr._serve(self._instance, self._member, self._requests, self._replace).__await__()

    async def __aenter__(self) -> ArrayResponse:
        self._response = await self
        return self._response

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
    backend : {"auto", "simulator", "cuda"} or Backend, optional
        ``"auto"`` (the default) uses the GPU when there is a usable one and the simulator
        otherwise. Not given: ``AIOCUBIE_BACKEND``, else ``"auto"``.
    mode : {"passive", "active"}, optional
        Passive (the default): use free memory, chunk only when needed. Active: each group is
        limited to the sum of its members' caps minus what they hold. Not given:
        ``AIOCUBIE_MODE``, else ``"passive"``.
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
        Allocator plugin to start with. Not given: ``AIOCUBIE_ALLOCATOR`` for a backend the
        manager creates (a backend passed in keeps its own).
    array_type : {"cupy", "numba"}, optional
        What device arrays are: CuPy arrays (the default; numpy's API, DLPack to torch) or
        numba device arrays (the cheapest numba kernel launches). The simulator hands out
        arrays that behave like the chosen type on a GPU.

    Environment variables (``AIOCUBIE_HISTORY`` too: see :meth:`record_history`) are read
    here; a bad value raises :class:`ConfigurationError` naming the variable.

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
        backend: str | Backend | None = None,
        *,
        device: int | None = None,
        mode: LimitMode | str | None = None,
        policy: Policy | str = "chunk",
        headroom: float = 0.05,
        batch_window: float = 0.002,
        max_batch: int | None = None,
        free_cache_seconds: float = 0.05,
        allocator: str | None = None,
        array_type: str | None = None,
    ) -> None:
        environ = os.environ
        if backend is None:
            backend = from_environment(environ, "AIOCUBIE_BACKEND", None, _backend_name)
            backend = "auto" if backend is None else backend
        if mode is None:
            mode = from_environment(environ, "AIOCUBIE_MODE", None, parse_mode)
            mode = LimitMode.PASSIVE if mode is None else mode
        if not isinstance(backend, Backend):
            allocator = from_environment(environ, "AIOCUBIE_ALLOCATOR", allocator, _allocator_name)
        history = from_environment(environ, "AIOCUBIE_HISTORY", None, parse_history)
        self._options = Options(
            mode=mode,
            policy=policy,
            headroom=headroom,
            batch_window=batch_window,
            max_batch=max_batch,
            free_cache_seconds=free_cache_seconds,
        )
        if not isinstance(backend, (str, Backend)):
            raise ConfigurationError(
                f"backend must be a name ('auto', 'simulator', 'cuda') or a Backend, got {backend!r}"
            )
        if allocator is not None and not isinstance(allocator, str):
            raise ConfigurationError(f"allocator must be a name or None, got {allocator!r}")
        self._owns_backend = not isinstance(backend, Backend)
        if isinstance(backend, str):
            backend = create_backend(backend, allocator=allocator, array_type=array_type, device=device or 0)
        elif device is not None and device != backend.device:
            raise ConfigurationError(
                f"device={device!r} but the backend given drives device {backend.device}: "
                "pass device to the backend, or a backend name"
            )
        elif array_type is not None and parse_array_type(array_type) != backend.array_type:
            raise ConfigurationError(
                f"array_type={array_type!r} but the backend given hands out {backend.array_type!r} arrays: "
                "pass array_type to the backend, or a backend name"
            )
        self.backend: Backend = backend
        if allocator is not None and not self._owns_backend and allocator != self.backend.allocator:
            self.backend.set_allocator(allocator)
        self._telemetry = Telemetry()
        self._reclaim_hooks: list[ReclaimHook] = []
        self._account = DeviceAccount(self.backend, self._options, self._memory_released, self._reclaim_hooks)
        self._history: HistoryRecorder | None = None  # the last one recorded, kept once stopped
        self._registry = Registry(self.backend.create_stream, self._telemetry)
        self._schedulers: dict[str, GroupScheduler] = {}  # one per live group, while running
        self._draining: list[GroupScheduler] = []  # of emptied groups, until their flights land
        self._task_group: anyio.abc.TaskGroup | None = None  # entered and exited by one task
        self._owner: int | None = None  # the id of that task
        self._loop: Loop | None = None  # while serving (between __aenter__ and aclose)
        self._closed = False  # close() was called: never runs again
        self._backend_closed = False  # our own backend was closed when the last `async with` ended
        if history:
            self.record_history(dump_on_oom=history if isinstance(history, str) else None)

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> MemoryManager:
        if self._closed:
            raise ManagerStateError("this manager was closed with close(): make a new MemoryManager")
        if self._task_group is not None:
            raise ManagerStateError("this manager is already running (or its `async with` has not ended yet)")
        if self._backend_closed:  # the backend we made was closed at the last exit: new streams
            self._registry.renew_streams()
            self._backend_closed = False
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        loop = Loop()
        self._task_group, self._loop, self._owner = task_group, loop, anyio.get_current_task().id
        # a collected member is reaped on the loop thread at once, not at the next manager call
        self._registry.on_collected = partial(loop.call_soon_threadsafe_or_drop, self._reap_collected)
        self._reap()
        for group in list(self._registry.groups.values()):
            self._start_scheduler(group)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None

    async def aclose(self) -> None:
        """Stop serving: fail what is still pending, free every array, stop the schedulers.

        Safe from any task of the manager's event loop, and when cancelled: the release is
        done before the first await, and the wait for the schedulers' tasks is shielded. The
        task that entered ``async with`` waits for the tasks (when it leaves, or here if it
        calls this); a manager that created its backend closes it (its streams and threads),
        and makes new streams if it is entered again.

        Raises
        ------
        ManagerStateError
            If called from a thread other than the manager's event loop's (nothing changes).
        """
        loop = self._loop
        if loop is not None:
            foreign = loop.foreign()
            if foreign is not None:
                raise ManagerStateError(f"aclose() from another thread: {foreign}")
            self._shut_down()
        task_group = self._task_group
        if task_group is None or anyio.get_current_task().id != self._owner:
            return  # only the task that entered the task group may exit it: it does on leaving
        self._task_group = self._owner = None
        # the task group's scope is the innermost one here: shielded, a cancellation of the
        # caller cannot cut the wait for the scheduler and hook tasks short (it is delivered
        # at the caller's next checkpoint); cancelled, it ends those tasks
        task_group.cancel_scope.shield = True
        task_group.cancel_scope.cancel()
        await task_group.__aexit__(None, None, None)

    def _shut_down(self) -> None:
        """Fail every open request, free every array, stop every scheduler (sync: no await)."""
        self._loop = None
        self._registry.on_collected = None
        closed = ManagerStateError("the memory manager was closed before the request was served")
        schedulers, self._schedulers = [*self._schedulers.values(), *self._draining], {}
        self._draining = []
        for scheduler in schedulers:
            for response in scheduler.close(closed):
                self._account.release(response)
        self.free_all()
        if self._owns_backend:
            self.backend.close()
            self._backend_closed = True

    def close(self) -> None:
        """Release the backend's resources (streams, threads) if this manager created it.

        The manager cannot be used with ``async with`` again (ManagerStateError).
        """
        if self._task_group is not None:
            raise ManagerStateError("close() on a running manager: leave its `async with` first")
        self._closed = True
        self.free_all()
        if self._owns_backend:
            self.backend.close()

    @property
    def running(self) -> bool:
        """True inside ``async with mgr`` (until :meth:`aclose`)."""
        return self._loop is not None

    @property
    def options(self) -> Options:
        """The manager's options (frozen; change mode and policy with their setters)."""
        return self._options

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
        owner: object = None,
    ) -> None:
        """Register ``instance``: give it a VRAM budget and a stream group.

        Parameters
        ----------
        instance : object
            The component; held weakly where it allows it, and unregistered (its arrays freed)
            when it is garbage-collected: at once on the loop thread while the manager runs,
            else at the next manager call.
        proportion : float, optional
            Share of VRAM in (0, 1] (manual pool); omitted, it joins the auto pool.
        stream_group : str
            Instances of one group share a stream and are batched together.
        invalidate_hook : callable, optional
            Called with no argument on a context reset (set_allocator, invalidate_all); an
            async one (``async def`` or ``async def __call__``) runs as a task of the manager.
        ready_hook : callable, optional
            Called with each ArrayResponse of the group's batches: a plain callable in the
            loop thread as the batch resolves, an async one as a task of its own.
            A hook that is a bound method of ``instance`` (or ``instance`` itself) is held
            weakly: hooks never keep the instance alive.
        name : str, optional
            Name in stats and logs (default: the type name and a number).
        owner : object, optional
            Scope its ready hook to one owner, as cubie 0.17 does (a solver registers its array
            managers with ``owner=solver``, and itself with ``owner=itself``): when ``instance``
            has nothing in a batch, its ready hook is told the batch's plan only if a member of
            the same owner asked in it (a member registered without an owner counts as its own
            owner). Not given, it is told the plan of every batch of its group. Only ``id(owner)``
            is kept: the owner is not held.

        Raises
        ------
        RegistrationError
            If ``instance`` is already registered, or a hook is not callable or the group
            name not a non-empty string.
        BudgetError
            If ``proportion`` is outside (0, 1] or does not fit the budget.
        """
        self._reap()
        registry = self._registry
        settings: dict[str, Any] = dict(
            group=stream_group, name=name, invalidate_hook=invalidate_hook, ready_hook=ready_hook
        )
        registry.check_new(instance, **settings)
        self._account.budget.add(id(instance), proportion)  # validates: nothing is half-registered
        member = registry.add(instance, **settings)
        if owner is not None:
            member.owner = id(owner)
        self._scheduler_of(member.group)

    def unregister(self, instance: object) -> None:
        """Forget ``instance``: free its arrays, withdraw its queued requests, drop its budget."""
        self._unregister(self._member(instance).key)

    def is_registered(self, instance: object) -> bool:
        """True if ``instance`` is registered."""
        self._reap()
        return id(instance) in self._registry.members

    def _unregister(self, key: int) -> None:
        member = self._registry.remove(key)
        self._account.budget.remove(key)
        gone = RegistrationError(f"{member.name} was unregistered before its request was served")
        for scheduler in self._every_scheduler():
            for response in scheduler.drop(key, gone):
                self._account.release(response)
        self._account.release_where(lambda a: a.key == key)
        # the id may be reused by a new instance: keep the peak under the name, forget the id
        member.counters.peak_bytes = max(member.counters.peak_bytes, self._account.ledger.forget(key))
        self._telemetry.retire_instance(member.name)
        if member.group not in self._registry.groups:
            self._retire(member.group)
        self._changed()  # caps changed, and an open batch may no longer wait for this member

    def _reap(self) -> None:
        for key in self._registry.reap():
            log.debug("unregistering collected %s", self._registry.name_of(key))
            self._unregister(key)

    def _reap_collected(self) -> None:
        # a loop callback (scheduled by the registry's finalizer): must never raise
        try:
            self._reap()
        except Exception:
            log.exception("unregistering a collected instance failed")

    def _retire(self, name: str) -> None:
        """Group ``name`` lost its last member: stop its scheduler task, forget its totals.

        Its stream is dropped with the group (batches in flight keep it until they land).
        """
        scheduler = self._schedulers.pop(name, None)
        self._draining = [s for s in self._draining if s.pending()]
        if scheduler is not None:
            scheduler.stop()
            if scheduler.pending():  # in-flight batches resolve from loop callbacks, no task
                self._draining.append(scheduler)
        ledger = self._account.ledger
        if not ledger.live_by_group.get(name):
            peak = ledger.forget_group(name)
            counters = self._telemetry.groups.get(name)
            if counters is not None:
                counters.peak_bytes = max(counters.peak_bytes, peak)

    def _member(self, instance: object) -> Member:
        self._reap()
        return self._registry.member(instance)

    # -- budget ----------------------------------------------------------------------------
    @property
    def mode(self) -> LimitMode:
        """``passive`` or ``active`` (change it with :meth:`set_limit_mode`)."""
        return self._options.mode

    @property
    def policy(self) -> Policy:
        """The active-mode policy (change it with :meth:`set_policy`)."""
        return self._options.policy

    @property
    def active(self) -> bool:
        """True in active mode."""
        return self._options.active

    def set_limit_mode(self, mode: LimitMode | str) -> None:
        """Switch between ``"passive"`` and ``"active"``.

        Raises
        ------
        ConfigurationError
            For an unknown mode.
        """
        self._configure(mode=mode)

    def set_policy(self, policy: Policy | str) -> None:
        """Set the active-mode policy: ``"chunk"``, ``"wait"`` or ``"fail"``.

        Raises
        ------
        ConfigurationError
            For an unknown policy.
        """
        self._configure(policy=policy)

    def _configure(self, **changes: Any) -> None:
        options = self._options = self._options.replace(**changes)
        self._account.options = options
        for scheduler in self._schedulers.values():
            scheduler.configure(options)

    def proportion(self, instance: object) -> float:
        """Share of VRAM ``instance`` may use."""
        return self._account.budget.proportion(self._member(instance).key)

    def manual_proportion(self, instance: object) -> float | None:
        """The share of VRAM reserved for ``instance`` (its manual proportion), or None when it
        is in the auto pool (as cubie 0.17's ``manual_proportion``)."""
        return self._account.budget.manual_proportion(self._member(instance).key)

    def update(
        self, instance: object, updates: Mapping[str, Any] | None = None, *, silent: bool = False, **more: Any
    ) -> set[str]:
        """Change ``instance``'s memory settings by name, as cubie 0.17's ``update`` does.

        Parameters
        ----------
        instance : object
            A registered instance.
        updates : mapping, optional
            Setting name -> new value: ``stream_group`` (moves it, see
            :meth:`change_stream_group`; None changes nothing), ``mem_proportion`` (a manual
            proportion; None puts it in the auto pool) and ``memory_manager`` (only this manager
            or None: an instance cannot change manager).
        silent : bool
            Ignore names it does not know instead of raising.
        **more
            Further settings, by keyword.

        Returns
        -------
        set of str
            The names it knows among those given (whether or not their value changed anything).

        Raises
        ------
        ConfigurationError
            For names it does not know (unless ``silent``); nothing is changed then.
        RegistrationError
            If ``instance`` is not registered, or ``memory_manager`` names another manager.
        BudgetError
            If the proportion is invalid or does not fit the budget.
        """
        changes = {**(updates or {}), **more}
        member = self._member(instance)
        known = {"memory_manager", "stream_group", "mem_proportion"}
        unknown = sorted(set(changes) - known)
        if unknown and not silent:
            raise ConfigurationError(
                f"update() does not know {', '.join(map(repr, unknown))}: the memory settings are "
                f"{', '.join(sorted(known))} (pass silent=True to ignore other names)"
            )
        manager = changes.get("memory_manager")
        if manager is not None and manager is not self:
            raise RegistrationError(
                f"{member.name} cannot change memory manager: unregister it here and register it with the other"
            )
        group = changes.get("stream_group")
        if group is not None and group != member.group:
            self.change_stream_group(instance, group)
        if "mem_proportion" in changes:
            proportion = changes["mem_proportion"]
            if proportion is None:
                if self._account.budget.is_manual(member.key):
                    self.set_auto_limit_mode(instance)
            else:
                self.set_manual_proportion(instance, proportion)
        return set(changes) & known

    def cap(self, instance: object) -> int:
        """Bytes ``instance`` may use: proportion x total VRAM.

        A batch is offered less than its group's caps: what the members hold is taken off (active
        mode), then the headroom (``(1 - headroom) x``) and the allocator's granule. Planning
        errors name the bytes offered.
        """
        return self._account.budget.cap(self._member(instance).key)

    @property
    def manual_pool_proportion(self) -> float:
        """Share of VRAM assigned to manual members."""
        self._reap()
        return self._account.budget.manual_pool_proportion

    @property
    def auto_pool_proportion(self) -> float:
        """Share of VRAM split among auto members."""
        self._reap()
        return self._account.budget.auto_pool_proportion

    def set_manual_proportion(self, instance: object, proportion: float) -> None:
        """Give ``instance`` a manual ``proportion`` (moving it out of the auto pool)."""
        self._account.budget.set_manual(self._member(instance).key, proportion)
        self._changed()

    def set_manual_limit_mode(self, instance: object, proportion: float) -> None:
        """Move ``instance`` from the auto pool to the manual pool with ``proportion``.

        Raises
        ------
        BudgetError
            If ``instance`` already has a manual proportion.
        """
        member = self._member(instance)
        if self._account.budget.is_manual(member.key):
            raise BudgetError(f"{member.name} is already in the manual pool: use set_manual_proportion")
        self._account.budget.set_manual(member.key, proportion)
        self._changed()

    def set_auto_limit_mode(self, instance: object) -> None:
        """Move ``instance`` from the manual pool to the auto pool."""
        self._account.budget.set_auto(self._member(instance).key)
        self._changed()

    def get_available_memory(self, group: str) -> int:
        """Bytes ``group`` may use now (warns above 95% use in active mode)."""
        self._reap()
        members = self._registry.group(group).members
        free = self._account.free_memory(fresh=True)
        return self._account.available(members, free, group=group, warn=True)

    def memory_info(self) -> MemoryInfo:
        """Free and total device memory, read now."""
        return self.backend.memory_info()

    # -- stream groups ---------------------------------------------------------------------
    def get_stream(self, instance: object) -> Any:
        """The stream of ``instance``'s group."""
        return self._registry.groups[self._member(instance).group].stream

    def get_stream_group(self, instance: object) -> str:
        """The name of ``instance``'s stream group."""
        return str(self._member(instance).group)

    def change_stream_group(self, instance: object, new_group: str) -> None:
        """Move ``instance`` to ``new_group`` (created if new).

        Its queued requests, and those waiting for memory, move with it and are planned
        against the new group's budget; those in flight finish in the old group. What it holds
        counts in the new group from then on (which may take that group over its cap: it then
        starts no new batch until back under). A group left empty is forgotten, its stream and
        scheduler task released.
        """
        member = self._member(instance)
        old, new = self._registry.move(member, new_group)
        if old is not new:
            # what it holds counts in its new group from now on, as its budget does
            if self._account.history is not None:
                held = self._account.ledger.live_by_key.get(member.key, 0)
                self._account.history.regrouped(member.key, old.name, new.name, held)
            self._account.ledger.regroup(member.key, new.name)
            moving = self._schedulers[old.name].take(member.key) if old.name in self._schedulers else []
            target = self._scheduler_of(new.name)
            if target is not None:
                target.adopt(moving)
            if old.name not in self._registry.groups:
                self._retire(old.name)
        self._changed()

    def is_grouped(self, instance: object) -> bool:
        """True if ``instance`` shares its stream group with another instance."""
        return len(self._registry.groups[self._member(instance).group].members) > 1

    @property
    def stream_groups(self) -> dict[str, list[str]]:
        """Group name -> names of its members."""
        self._reap()  # a collected instance is no member
        members = self._registry.members
        return {
            name: sorted(members[key].name for key in group.members) for name, group in self._registry.groups.items()
        }

    def reinit_streams(self) -> None:
        """Give every group a new stream (after a context reset)."""
        self._registry.renew_streams()

    # -- requests --------------------------------------------------------------------------
    def request(
        self, instance: object, requests: Mapping[str, ArrayRequest], *, replace: bool = False
    ) -> PendingRequest:
        """Ask for arrays: ``await`` the result, or ``async with`` it to free them on exit.

        The requests are checked now (bad ones raise at once); they are queued when awaited.

        Parameters
        ----------
        instance : object
            A registered instance.
        requests : mapping
            Label -> :class:`ArrayRequest`.
        replace : bool
            Replace ``instance``'s arrays of these labels, as cubie does when a label is asked
            for again: when the request is awaited, they are freed first (as
            :meth:`free` ``(label, instance)`` frees them), so the batch is planned with their
            memory back, and each label then names one array. Off (the default), earlier
            arrays of a label are kept until released.

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
        return PendingRequest(self, instance, self._member(instance), checked, _flag("replace", replace))

    async def _serve(
        self, instance: object, member: Member, requests: RequestSet, replace: bool = False
    ) -> ArrayResponse:
        """Submit a request when it is awaited and wait for it (PendingRequest's await)."""
        loop = self._loop
        if loop is None or loop.thread != get_ident():
            raise self._not_serving(loop)
        self._reap()
        if self._registry.members.get(member.key) is not member:  # unregistered since request()
            member = self._registry.member(instance)
        if replace:
            self._replace(member, requests)
        group = self._registry.groups[member.group]
        ticket = Ticket(member.key, requests, (group.counters, member.counters))
        group.counters.requests += 1
        member.counters.requests += 1
        # queued (or served, when it closes a batch at once) in the order requests are awaited
        self._schedulers[member.group].submit(ticket)
        try:
            if ticket.done:
                await loop.checkpoint()  # awaiting a request is a checkpoint, even one served at once
            else:
                await ticket.wait(loop.signal)
        except BaseException:
            self._cancel(ticket)
            raise
        return ticket.result()

    @staticmethod
    def _not_serving(loop: Loop | None) -> ManagerStateError:
        if loop is None:
            return ManagerStateError("the memory manager is not running: use `async with MemoryManager() as mgr:`")
        return ManagerStateError(f"a request awaited from another thread: {loop.foreign()}")

    def _cancel(self, ticket: Ticket) -> None:
        was_pending = ticket.pending
        self._account.release(ticket.cancel())
        if was_pending:
            for scheduler in self._schedulers.values():
                scheduler.withdraw(ticket)

    def flush(self, group: str | None = None) -> None:
        """Close the batch being collected in ``group`` (all groups if None) now."""
        names = list(self._schedulers) if group is None else [self._registry.group(group).name]
        for name in names:
            scheduler = self._schedulers.get(name)
            if scheduler is not None:
                scheduler.flush()

    def _replace(self, member: Member, requests: RequestSet) -> None:
        """Free ``member``'s arrays of the labels ``requests`` asks for (a replacing request)."""
        labels, key = requests.arrays.keys(), member.key
        self._free_where(lambda a: a.key == key and a.label in labels, "a request replacing its labels")

    def allocate_all(
        self, instance: object, requests: Mapping[str, ArrayRequest], *, replace: bool = False
    ) -> ArrayResponse:
        """Allocate ``requests`` for ``instance`` now, unbatched and unchunked, on its stream.

        The arrays are usable after ``await mgr.sync_stream(instance)``; release them with
        :meth:`release`, :meth:`free` or :meth:`free_all`. Works without ``async with``.
        ``replace=True`` frees ``instance``'s arrays of these labels first (see :meth:`request`).

        Raises
        ------
        InvalidRequestError
            For a malformed mapping or arrays that disagree on the run length (requests that
            could never be allocated are refused when their ArrayRequest is built).
        InsufficientMemoryError
            If the arrays do not fit whole in what the instance's group is offered.
        AllocationError
            If the backend fails (nothing stays allocated).
        """
        checked = check_requests(requests)
        member = self._member(instance)
        if _flag("replace", replace):
            self._replace(member, checked)
        group = self._registry.groups[member.group]
        account = self._account
        free = account.free_memory(fresh=True)
        offered = account.offered(group.members, free)
        plan = plan_chunks(checked.runs, checked.fixed, checked.per_run, offered, free=free)
        if plan.chunks > 1:
            raise InsufficientMemoryError(
                f"allocate_all needs {plan.full_bytes} bytes whole but group {member.group!r} is "
                f"offered {plan.offered}: use await mgr.request() to have it chunked"
            )
        (response,), _ = account.allocate([(member.key, checked)], member.group, plan, group.stream)
        return response

    def allocate(self, instance: object, request: ArrayRequest, label: str = "array", *, replace: bool = False) -> Any:
        """Allocate one array for ``instance`` now (see :meth:`allocate_all`)."""
        return self.allocate_all(instance, {label: request}, replace=replace).arrays[label]

    # -- release ---------------------------------------------------------------------------
    def release(self, response: ArrayResponse) -> None:
        """Free the arrays of ``response``. Idempotent."""
        self._account.release(response)

    def free(self, label: str, instance: object | None = None) -> None:
        """Free the arrays labelled ``label``: ``instance``'s only, or (None) every instance's.

        Labels are not scoped: without ``instance`` this frees the ``label`` arrays of every
        member. Requests still in flight whose arrays are freed fail with
        :class:`ReleasedError` (and the rest of their arrays are freed too).

        Raises
        ------
        RegistrationError
            If ``instance`` is given and not registered.
        """
        if instance is None:
            self._free_where(lambda a: a.label == label, f"free({label!r})")
        else:
            key = self._member(instance).key
            self._free_where(lambda a: a.label == label and a.key == key, f"free({label!r}, instance)")

    def free_all(self) -> None:
        """Free every array the manager handed out (requests in flight fail with ReleasedError)."""
        self._free_where(lambda a: True, "free_all()")

    def _free_where(self, predicate: Callable[[Allocation], bool], cause: str) -> None:
        owners = {id(a.owner) for a in self._account.release_where(predicate)}
        if owners:
            error = ReleasedError(f"{cause} freed this request's arrays before it resolved; request again")
            for scheduler in self._every_scheduler():
                for response in scheduler.fail_in_flight(owners, error):
                    self._account.release(response)

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
        if not isinstance(name, str) or name not in ALLOCATORS:  # before the backend sees it
            raise UnknownAllocatorError(
                f"unknown allocator {shown(name)}: use one of {', '.join(map(repr, ALLOCATORS))}"
            )
        self.backend.set_allocator(name)  # first: an unknown name must not warn of a reset
        warn(f"set_allocator({name!r}) resets the device context: arrays and compiled kernels from before are invalid")
        self._reset(f"set_allocator({name!r})")
        self._account.forget_all()  # the context that held them is gone
        self.reinit_streams()
        self._call_invalidate_hooks()

    def _reset(self, cause: str) -> None:
        error = ContextResetError(f"{cause} reset the device context while this request was in flight; request again")
        for scheduler in self._every_scheduler():
            scheduler.reset(error)

    def _call_invalidate_hooks(self) -> None:
        for member in list(self._registry.members.values()):
            hook = member.invalidate_hook  # None once the instance of a weakly held hook is gone
            if hook is None:
                continue
            what = f"invalidate hook of {member.name}"
            if member.invalidate_async:
                self._spawn_hook(partial(call_hook, hook, (), what), what)
                continue
            try:
                result = hook()
            except Exception:
                log.exception("%s raised", what)
                continue
            if inspect.isawaitable(result):  # a plain callable that returned an awaitable
                self._spawn_hook(partial(await_hook, result, what), what, result)

    def _spawn_hook(self, run: Callable[[], Any], what: str, awaitable: object = None) -> None:
        """Run an async hook as a task of the manager; warn if the manager is not running."""
        if self._task_group is not None and self._loop is not None and self._loop.thread == get_ident():
            self._task_group.start_soon(run, name=f"aiocubie {what}")
            return
        close = getattr(awaitable, "close", None)
        if close is not None:
            close()  # it cannot be awaited: spare the "never awaited" warning
        warn(
            f"{what} is async and the manager is not serving in this thread, so it was not run: "
            "reset the context inside `async with mgr`"
        )

    # -- host arrays, copies, streams, managed memory -------------------------------------
    def create_host_array(
        self,
        shape: int | Sequence[int],
        dtype: Any,
        kind: MemoryKind | str = "pinned",
        like: np.ndarray[Any, Any] | None = None,
        *,
        pool: bool = False,
    ) -> np.ndarray[Any, Any]:
        """A C-contiguous host array, ``pinned`` or ``host``: zeros, or a copy of ``like``.

        With ``pool=True`` a pinned array comes from the backend's pinned staging pool (the
        walks' pool: exact sizes, reused) and goes back to it when the array and every view
        of it are collected; :meth:`release_pinned` unpins what the pool keeps.

        Raises
        ------
        InvalidRequestError
            For a bad shape, dtype or kind (as :class:`ArrayRequest` checks them), or a ``like``
            of another shape or with values the dtype cannot hold (``1e308`` in int8).
        AllocationError
            If the host memory cannot be had.
        """
        request = ArrayRequest(shape, dtype, kind, unchunkable=True)
        if request.kind not in (MemoryKind.PINNED, MemoryKind.HOST):
            raise InvalidRequestError(f"host arrays are 'pinned' or 'host', not {request.kind.value!r}")
        if like is not None:  # checked before anything is allocated
            try:
                like_shape = np.shape(like)
            except (TypeError, ValueError) as exc:  # ragged lists
                raise InvalidRequestError(f"like={shown(like)} is not an array numpy can read: {exc}") from None
            if like_shape != request.shape:
                raise InvalidRequestError(f"like has shape {like_shape}, not {request.shape}")
        try:
            if pool and request.kind is MemoryKind.PINNED:
                staging = self.backend.pinned_pool
                buffer = staging.acquire(request.nbytes)
                array = buffer[: request.nbytes].view(request.dtype).reshape(request.shape)
                array.fill(0)
                weakref.finalize(array, staging.release, buffer)
            else:
                array = self.backend.host_array(request.shape, request.dtype, request.kind)
        except AiocubieError:
            raise
        except MemoryError as exc:  # a backend that let numpy's through
            raise AllocationError(
                f"cannot allocate a {request.kind.value} host array of {request.nbytes} bytes "
                f"({request.shape}, {request.dtype}): {exc}"
            ) from exc
        if like is not None:
            try:
                with np.errstate(
                    over="raise", invalid="raise"
                ):  # a value the dtype cannot hold is refused, not wrapped
                    array[...] = like
            except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:  # text, objects, 1e308 into int8
                raise InvalidRequestError(
                    f"like={shown(like)} cannot be copied into a {request.dtype} host array: {exc}"
                ) from exc
        return array

    def release_pinned(self) -> int:
        """Unpin the free buffers of the pinned staging pool; return the bytes released.

        Buffers in use (by a walk, or a ``create_host_array(pool=True)`` array still alive)
        stay; they are kept for reuse when given back.
        """
        return self.backend.pinned_pool.clear()

    async def to_device(self, instance: object, host_arrays: Sequence[Any], device_arrays: Sequence[Any]) -> None:
        """Copy each host array into its device array on ``instance``'s stream; wait until done.

        Raises
        ------
        InvalidRequestError
            Before anything is copied: unless both are lists (or tuples) of arrays, paired up.
        BackendError
            If a pair's shapes or dtypes differ, or the copy fails.
        """
        await self._copy(instance, host_arrays, device_arrays, ("host_arrays", "device_arrays"))

    async def from_device(self, instance: object, device_arrays: Sequence[Any], host_arrays: Sequence[Any]) -> None:
        """Copy each device array into its host array on ``instance``'s stream; wait until done.

        Raises
        ------
        InvalidRequestError
            As :meth:`to_device`.
        """
        await self._copy(instance, device_arrays, host_arrays, ("device_arrays", "host_arrays"))

    async def _copy(
        self,
        instance: object,
        sources: Sequence[Any],
        targets: Sequence[Any],
        names: tuple[str, str] = ("sources", "targets"),
    ) -> None:
        # what is not a list of arrays is refused before anything is queued (the backend checks each pair)
        for given, name in ((sources, names[0]), (targets, names[1])):
            if not isinstance(given, Sequence) or isinstance(given, (str, bytes)):
                raise InvalidRequestError(
                    f"{name} must be a list of arrays, got {shown(given)}: wrap a single array in a list"
                )
            for index, array in enumerate(given):
                if not (hasattr(array, "shape") and hasattr(array, "dtype")):
                    raise InvalidRequestError(
                        f"{name}[{index}] is {shown(array)}, not an array: pass numpy arrays "
                        "(np.asarray(x)) and the arrays of a response"
                    )
        if len(sources) != len(targets):
            raise InvalidRequestError(f"{len(sources)} {names[0]} but {len(targets)} {names[1]}: pair them up")
        stream = self.get_stream(instance)
        for src, dst in zip(sources, targets):
            self.backend.copy(src, dst, stream)
        await self._wait_for(stream)

    async def sync_stream(self, instance: object) -> None:
        """Wait until everything queued on ``instance``'s stream is done (without blocking)."""
        await self._wait_for(self.get_stream(instance))

    @property
    def device(self) -> int:
        """The id of the device this manager drives."""
        return self.backend.device

    def on_device(self) -> AbstractContextManager[Any]:
        """A context manager that makes this manager's device current in the calling thread.

        Launch kernels and CuPy work on a manager's arrays inside it when the program uses
        several devices (``with mgr.on_device(): kernel[blocks, threads, stream](...)``).
        """
        return self.backend.activate()

    async def prefetch(self, instance: object, array: Any, device: int | Literal["own"] | None = "own") -> None:
        """Prefetch managed ``array`` to ``device`` (``"own"``: this manager's; None: the CPU)
        on ``instance``'s stream."""
        stream = self.get_stream(instance)
        self.backend.prefetch(array, self._location(device), stream)
        await self._wait_for(stream)

    def _location(self, device: Any) -> Any:
        return self.device if isinstance(device, str) and device == "own" else device

    async def _wait_for(self, stream: Any) -> None:
        event = self.backend.record_event(stream)
        loop = self._loop
        await (loop.wait(event) if loop is not None and loop.thread == get_ident() else wait_event(event))

    def advise(self, array: Any, advice: Advice, device: int | Literal["own"] | None = "own") -> None:
        """Give managed-memory ``advice`` (preferred_location, accessed_by, read_mostly) about
        ``device`` (``"own"``: this manager's; None: the CPU).

        Raises
        ------
        InvalidRequestError
            For advice that is not a string, or a device that is not an int >= 0 or None (the CPU).
        BackendError
            For advice the backend does not know.
        """
        if not isinstance(advice, str):  # the backend names what it knows; it needs a str to look up
            raise InvalidRequestError(
                f"advice must be a string (preferred_location, accessed_by, read_mostly), got {shown(advice)}"
            )
        device = check_device(self._location(device))
        self.backend.advise(array, advice, device)

    # -- observability ---------------------------------------------------------------------
    def stats(self) -> Snapshot:
        """Live and peak bytes, requests, batches, chunks and latencies, per group and instance."""
        self._reap()
        ledger = self._account.ledger
        info = self.backend.memory_info()
        budget = self._account.budget
        active = self._options.active  # caps are enforced (and reported) in active mode only
        groups = {}
        for name, counters in self._telemetry.groups.items():
            group = self._registry.groups.get(name)
            cap = budget.group_cap(group.members) if active and group is not None else None
            peak = max(ledger.peak_by_group.get(name, 0), counters.peak_bytes)
            groups[name] = UsageStats.of(counters, ledger.live_by_group.get(name, 0), peak, cap)
        by_name = {m.name: m.key for m in self._registry.members.values()}
        instances = {}
        for name, counters in self._telemetry.instances.items():
            key = by_name.get(name)
            live, peak = ledger.live_by_key.get(key, 0), ledger.peak_by_key.get(key, 0)
            cap = budget.cap(key) if active and key is not None else None
            instances[name] = UsageStats.of(counters, live, max(peak, counters.peak_bytes), cap)
        pool = self.backend.pinned_pool
        pinned = PinnedStats(pool.held, pool.in_use, pool.peak_in_use, pool.pinned)
        return Snapshot(
            Snapshot.now(),
            info.free,
            info.total,
            ledger.live,
            ledger.peak,
            groups,
            instances,
            pinned,
            time.time(),
            self.backend.pool_facts(),
            self._account.recovery,
        )

    def memory_summary(self) -> str:
        """A table of :meth:`stats` to read at a glance: device and pool bytes, then per group
        and per instance live, peak and cap bytes, requests, batches, chunks, failures and the
        wait and ready latencies (median / 99th percentile), then the recovery counts.

        Examples
        --------
        >>> print(mgr.memory_summary())   # doctest: +SKIP
        """
        return summary(self.stats())

    def reset_peak_stats(self, *, group: str | None = None, instance: object | None = None) -> None:
        """Peaks start again from what is held now: of ``group``, of ``instance``, or (neither given) all of them.

        Raises
        ------
        RegistrationError
            For a group that does not exist, or an instance that is not registered.
        """
        ledger, telemetry = self._account.ledger, self._telemetry
        if group is None and instance is None:
            ledger.reset_peaks(keys=list(ledger.peak_by_key), groups=list(ledger.peak_by_group), total=True)
            for counters in (*telemetry.groups.values(), *telemetry.instances.values()):
                counters.peak_bytes = 0
            scope = "all"
        else:
            names = []
            if group is not None:
                name = self._registry.group(group).name
                ledger.reset_peaks(groups=[name])
                telemetry.group(name).peak_bytes = 0
                names.append(f"group {name!r}")
            if instance is not None:
                member = self._member(instance)
                ledger.reset_peaks(keys=[member.key])
                member.counters.peak_bytes = 0
                names.append(member.name)
            scope = ", ".join(names)
        if self._account.history is not None:
            self._account.history.reset(f"peak stats ({scope})")

    # -- history and recovery ------------------------------------------------------------
    def record_history(
        self,
        enabled: bool = True,
        *,
        max_entries: int = MAX_ENTRIES,
        stacks: bool = False,
        dump_on_oom: str | os.PathLike[str] | None = None,
    ) -> None:
        """Start (or, ``enabled=False``, stop) recording the allocation history.

        Every plan, allocation, release, failure, out-of-memory recovery step and reset is
        kept, the most recent ``max_entries`` of them; starting again starts a new history.
        Off (the default), it costs one attribute check per batch and release. The
        environment variable ``AIOCUBIE_HISTORY`` (``1`` or ``FILE.json``) starts it when the
        manager is made.

        Parameters
        ----------
        enabled : bool
            Record (True) or stop recording (False; :meth:`history` still has what was recorded).
        max_entries : int
            Events kept (a ring: the oldest go first).
        stacks : bool
            Also keep the stack each plan and allocation was made from (costly: for debugging).
        dump_on_oom : str or path, optional
            Write the history there (JSON) when an allocation fails after every recovery step
            (if it cannot be written, that is logged and the OutOfMemoryError raised all the same).

        Raises
        ------
        ConfigurationError
            For ``max_entries`` that is not an int >= 1, or ``dump_on_oom`` that is not a path.
        """
        if not enabled:
            self._account.history = None
            return
        self._history = self._account.history = HistoryRecorder(
            max_entries,
            stacks=stacks,
            ledger=self._account.ledger,
            names=self._registry.name_of,  # type: ignore[arg-type]
            dump_on_oom=dump_on_oom,
        )

    def history(self) -> History:
        """The allocation history recorded so far (see :meth:`record_history`).

        Raises
        ------
        ConfigurationError
            If no history was ever recorded.
        """
        if self._history is None:
            raise ConfigurationError(
                "no allocation history was recorded: call mgr.record_history() first (or set AIOCUBIE_HISTORY=1)"
            )
        return self._history.history()

    def add_reclaim_hook(self, hook: ReclaimHook) -> None:
        """Call ``hook(nbytes)`` when an allocation is out of memory even with the pool's cache freed.

        The hook frees what it can (``mgr.release``, ``mgr.free``, spilling to the host) and
        returns the bytes it freed, or None if it cannot say; the allocation is then tried
        once more. Hooks run in the order added, synchronously on the allocation's path (in
        the requesting task, or the group's): they must not block long, and cannot await.
        A hook that raises is logged and skipped. The manager holds ``hook`` until
        :meth:`remove_reclaim_hook`.

        Raises
        ------
        ConfigurationError
            If ``hook`` is not callable.
        """
        if not callable(hook):
            raise ConfigurationError(f"a reclaim hook must be callable as hook(nbytes), got {shown(hook)}")
        self._reclaim_hooks.append(hook)

    def remove_reclaim_hook(self, hook: ReclaimHook) -> None:
        """Stop calling ``hook`` (nothing if it was not added)."""
        if hook in self._reclaim_hooks:
            self._reclaim_hooks.remove(hook)

    # -- wiring ----------------------------------------------------------------------------
    def _scheduler_of(self, name: str) -> GroupScheduler | None:
        """The scheduler of group ``name``, started if the manager runs (None if it does not)."""
        scheduler = self._schedulers.get(name)
        if scheduler is None and self._loop is not None:
            scheduler = self._start_scheduler(self._registry.groups[name])
        return scheduler

    def _start_scheduler(self, group: Group) -> GroupScheduler:
        assert self._task_group is not None and self._loop is not None
        scheduler = GroupScheduler(
            group, self._registry.members, self._options, self._account, self._loop, self._task_group.start_soon
        )
        self._schedulers[group.name] = scheduler
        self._task_group.start_soon(scheduler.run, name=f"aiocubie scheduler {group.name!r}")
        return scheduler

    def _memory_released(self) -> None:
        self._changed()

    def _changed(self) -> None:
        for scheduler in self._schedulers.values():
            scheduler.changed()

    def _every_scheduler(self) -> list[GroupScheduler]:
        """The schedulers of live groups, and of emptied ones whose batches are still in flight."""
        return [*self._schedulers.values(), *self._draining] if self._draining else list(self._schedulers.values())


def _backend_name(value: str) -> str:
    if value not in BACKENDS:
        raise ConfigurationError(f"unknown backend {value!r}: use one of {', '.join(BACKENDS)}")
    return value


def _allocator_name(value: str) -> str:
    if value not in ALLOCATORS:
        raise UnknownAllocatorError(f"unknown allocator {value!r}: use one of {', '.join(ALLOCATORS)}")
    return value


_default: MemoryManager | None = None
_default_lock = threading.Lock()


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidRequestError(f"{name} takes True or False, got {shown(value)}")
    return bool(value)


def default_manager() -> MemoryManager:
    """The process-wide manager (``backend="auto"``), created on first use.

    Like any manager it serves requests inside ``async with default_manager():``.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = MemoryManager()
        return _default
