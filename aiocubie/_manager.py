"""The facade: MemoryManager, and the process-wide default manager.

It builds the components, each handed its collaborators, runs their lifecycle (``async with``)
and delegates each public call to the one that owns the concept. It holds no bookkeeping of its
own and never imports numba.cuda or cupy: the device is reached only through the backend.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._accounting import DeviceAccount
from ._backends import Allocator, Backend, create_backend
from ._broker.client import BrokerLease
from ._budget import LimitMode
from ._completion import running_loop
from ._entry import RequestEntry
from ._errors import ManagerStateError
from ._grouping import GroupsView
from ._groups import PendingRequest, StreamGroups
from ._history import MAX_ENTRIES, History
from ._hooks import Hooks
from ._libraries import LibraryScopes
from ._lifecycle import Lifecycle
from ._limits import BudgetView
from ._observe import Observer
from ._options import Options, Policy, Setup
from ._pool import PoolView
from ._registration import Registration
from ._registry import InvalidateHook, ReadyHook, Registry
from ._release import Release
from ._requests import ArrayRequest, ArrayResponse
from ._serving import Serving
from ._spill import Spills
from ._stats import ManagerStatistics, Snapshot, Telemetry, summary
from ._transfers import HostView

__all__ = ["MemoryManager", "PendingRequest", "default_manager"]


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
        Not given: ``AIOCUBIE_MODE``, else ``"passive"``. What the modes do: :class:`Options`.
    policy, headroom, batch_window, max_batch, free_cache_seconds
        The scheduling options, each described in :class:`Options` (``mgr.options``).
    memory_limit : int, optional
        The device bytes this manager budgets (None: the whole device): caps are proportions of
        it and plans fit in it, other libraries' bytes in the pool taken (see :class:`Options`).
    priority_aging : float or None
        Seconds a waiting request takes to gain one priority level (None: strict priorities;
        see :class:`Options` and docs/concepts/priorities.md).
    reclaim_timeout : float
        Seconds a round of async reclaim hooks may take before the batch goes on without them.
    allocator : str, MemoryResource or callable, optional
        The memory resource to start with: a registered name (``"default"``, ``"driver"``,
        ``"cupy"``, ``"cupy_async"``, ``"numba"``, ``"rmm"``, or one registered with
        ``aiocubie.mr.register_allocator``), a factory called with the device, or a resource made
        on the given backend's device (``aiocubie.mr``). Not given: ``AIOCUBIE_ALLOCATOR`` for a
        backend the manager creates (a backend passed in keeps its own).
    array_type : {"cupy", "numba"}, optional
        What device arrays are: CuPy arrays (the default; numpy's API, DLPack to torch) or
        numba device arrays (the cheapest numba kernel launches). The simulator hands out
        arrays that behave like the chosen type on a GPU.
    broker : str or path, optional
        The socket of a node broker (``python -m aiocubie broker``) to lease this manager's
        device memory from, so that the processes of a node share one budget (docs/broker.md).
        Not given: ``AIOCUBIE_BROKER``, else no broker.

    Notes
    -----
    Environment variables (``AIOCUBIE_HISTORY`` too: see :meth:`record_history`) are read
    here; a bad value raises :class:`ConfigurationError` naming the variable.

    Examples
    --------
    >>> import anyio
    >>> from aiocubie import ArrayRequest, MemoryManager
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
        memory_limit: int | None = None,
        priority_aging: float | None = 0.1,
        reclaim_timeout: float = 1.0,
        allocator: Allocator | None = None,
        array_type: str | None = None,
        broker: str | os.PathLike[str] | None = None,
    ) -> None:
        given = backend if isinstance(backend, Backend) else None
        setup = Setup.read(
            None if given is not None else backend,
            given_backend=None if given is None else (given.device.device_id, given.array_type),
            device=device,
            mode=mode,
            allocator=allocator,
            array_type=array_type,
            environ=os.environ,
            policy=policy,
            headroom=headroom,
            batch_window=batch_window,
            max_batch=max_batch,
            free_cache_seconds=free_cache_seconds,
            memory_limit=memory_limit,
            priority_aging=priority_aging,
            reclaim_timeout=reclaim_timeout,
            broker=broker,
        )
        owns_backend = given is None
        if given is None:
            assert setup.backend is not None
            given = create_backend(
                setup.backend, allocator=setup.allocator, array_type=setup.array_type, device=setup.device or 0
            )
        self.backend: Backend = given
        self._device = given.device
        self._compose(given, owns_backend, setup)
        if setup.history:
            self.record_history(dump_on_oom=setup.history if isinstance(setup.history, str) else None)

    def _compose(self, given: Backend, owns_backend: bool, setup: Setup) -> None:
        """Build the components, each handed its collaborators, and the views over them."""
        telemetry = Telemetry()
        registry = Registry(given.device.create_stream, telemetry)
        self._serving = serving = Serving()  # the loop and task group, while serving
        self._hooks = hooks = Hooks(registry, serving)
        self._account = account = DeviceAccount(
            given,
            setup.options,
            hooks.reclaim,
            allocator=None if owns_backend else setup.allocator,  # a given backend: a resource beside its own
            lease=None if setup.broker is None else BrokerLease(setup.broker, serving.spawn),
        )
        self._observer = observer = Observer(given.device, account, registry, telemetry)
        self._groups = groups = StreamGroups(registry, account, serving, observer.group_left)
        account.spills = Spills(  # a restore asks for its memory as its member's request would
            account,
            lambda key, requests, priority: groups.serve(
                registry.members[key], requests, running_loop(), priority=priority
            ),
        )
        self._registration = registration = Registration(registry, account, groups, observer.member_left)
        self._release = release = Release(registration, account, groups)
        self._lifecycle = lifecycle = Lifecycle(
            given, owns_backend, serving, registry, registration, groups, release.free_all
        )
        self._entry = RequestEntry(
            registration, account, groups, release.replace, serving, lifecycle.refusal, lifecycle.check_streams
        )
        self._host = host = HostView(given.device, serving, lifecycle.stream_of)
        self._budget = BudgetView(registry, registration, account, groups)
        self._grouping = GroupsView(
            registry, registration, groups, account, lifecycle.stream_of, host.wait_for, lifecycle.check_closed
        )
        self._pool = PoolView(registry, account, groups, hooks, release.free_all, LibraryScopes(account, registry))

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> MemoryManager:
        await self._lifecycle.enter()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None

    if not TYPE_CHECKING:  # at run time only: a type checker flags a plain `with` itself

        def __enter__(self) -> MemoryManager:
            raise ManagerStateError(
                "a MemoryManager is entered with `async with`, not `with`: write `async with "
                "MemoryManager() as mgr:` in an async function run by `asyncio.run(main())` or "
                "`anyio.run(main)` (a plain script can use aiocubie.cubie's adapter, which runs its own loop)"
            )

        def __exit__(self, *exc_info: object) -> None:
            return None

    async def aclose(self) -> None:
        """Stop serving: fail what is still pending, free every array, stop the schedulers.

        Safe from any task of the manager's loop, and when cancelled (the release is done before
        the first await; the wait for the tasks, by the task that entered ``async with``, is
        shielded). A manager that created its backend closes it, and makes new streams if it is
        entered again. Raises :class:`ManagerStateError` from another thread (nothing changes).
        """
        await self._lifecycle.aclose()

    def close(self) -> None:
        """Release the backend's resources (streams, threads) if this manager created it.

        The manager cannot be used with ``async with`` again (ManagerStateError).
        """
        self._lifecycle.close()

    @property
    def running(self) -> bool:
        """True inside ``async with mgr`` (until :meth:`aclose`)."""
        return self._serving.loop is not None

    @property
    def options(self) -> Options:
        """The manager's options (frozen; change the mode and policy through :attr:`budget`)."""
        return self._account.options

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
        priority: int = 0,
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
            Called with no argument on a context reset (``mgr.pool.set_allocator``, ``mgr.pool.invalidate_all``); an
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
        priority : int
            The priority of its requests that name none (``mgr.request(..., priority=)``):
            among requests waiting for memory, higher first (docs/concepts/priorities.md).

        Raises
        ------
        RegistrationError
            If ``instance`` is already registered, a hook is not callable, the group
            name not a non-empty string or the priority not an int.
        BudgetError
            If ``proportion`` is outside (0, 1] or does not fit the budget.
        """
        self._registration.register(
            instance,
            proportion=proportion,
            group=stream_group,
            invalidate_hook=invalidate_hook,
            ready_hook=ready_hook,
            name=name,
            owner=owner,
            priority=priority,
        )

    def unregister(self, instance: object) -> None:
        """Forget ``instance``: free its arrays, withdraw its queued requests, drop its budget."""
        self._registration.unregister(instance)

    def is_registered(self, instance: object) -> bool:
        """True if ``instance`` is registered."""
        return self._registration.is_registered(instance)

    # -- views -----------------------------------------------------------------------------
    @property
    def budget(self) -> BudgetView:
        """The budget: limit mode, policy, each member's proportion and cap, the pools."""
        return self._budget

    @property
    def groups(self) -> GroupsView:
        """The stream groups: streams, moves, flushes, waiting for a member's stream."""
        return self._grouping

    @property
    def host(self) -> HostView:
        """Host memory: host arrays, copies to and from the device, managed-memory prefetch and advice."""
        return self._host

    @property
    def pool(self) -> PoolView:
        """The memory pool: the allocator and its swap, sharing with other libraries, reclaim hooks."""
        return self._pool

    # -- requests --------------------------------------------------------------------------
    def request(
        self,
        instance: object,
        requests: Mapping[str, ArrayRequest],
        *,
        replace: bool = False,
        ordered: bool = False,
        priority: int | None = None,
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
        ordered : bool
            Resolve as soon as the arrays are allocated, ordered on the group's stream, instead
            of when the device reaches the allocation's event (the default): the request does not
            wait behind earlier work on that stream. Work queued on ``response.stream`` runs after
            the allocation; work on another stream must wait for ``response.ready`` first
            (:func:`walk_chunks` does). Ready hooks are still called when the event completes,
            by which time the requester may have released the arrays (docs/concepts/walks.md, "A batch stream").
        priority : int, optional
            Among requests waiting for memory (in the group's queue, and across groups for the
            free memory), higher first; first come, first served within a priority (None: the
            instance's, given to :meth:`register`). See docs/concepts/priorities.md.

        Returns
        -------
        PendingRequest
            Resolves to an :class:`ArrayResponse`.

        Raises
        ------
        InvalidRequestError
            For a malformed mapping, arrays of one request that disagree on the run length, or
            a priority that is not an int.
        RegistrationError
            If ``instance`` is not registered.
        PlanningError, AllocationError, ContextResetError, ManagerStateError
            When awaited, if the batch could not be served.
        """
        return self._entry.request(instance, requests, replace, ordered, priority)

    def allocate(
        self, instance: object, requests: Mapping[str, ArrayRequest], *, replace: bool = False
    ) -> ArrayResponse:
        """Allocate ``requests`` for ``instance`` now, unbatched and unchunked, on its stream.

        The arrays are usable after ``await mgr.groups.sync(instance)``; release them with
        :meth:`release`, :meth:`free` or :meth:`free_all`. Works without ``async with``.
        ``replace=True`` frees ``instance``'s arrays of these labels first (see :meth:`request`).

        Raises
        ------
        InvalidRequestError
            For a malformed mapping or arrays that disagree on the run length.
        InsufficientMemoryError
            If the arrays do not fit whole in what the instance's group is offered.
        AllocationError
            If the backend fails (nothing stays allocated).
        """
        return self._entry.allocate_all(instance, requests, replace)

    # -- release ---------------------------------------------------------------------------
    def release(self, response: ArrayResponse) -> None:
        """Free the arrays of ``response``. Idempotent.

        :class:`InvalidRequestError` for a request that was never awaited (a forgotten ``await``),
        and for anything but a response this manager handed out: an array, the ``arrays`` dict, a
        label (free one with :meth:`free`), None, another manager's response.
        """
        self._release.release(response)

    def free(self, label: str, instance: object | None = None) -> None:
        """Free the arrays labelled ``label``: ``instance``'s only, or (None) every instance's.

        Labels are not scoped: without ``instance`` this frees every member's ``label`` arrays.
        Requests in flight whose arrays are freed fail with :class:`ReleasedError` (the rest of
        their arrays are freed too). :class:`RegistrationError` for an unregistered ``instance``.

        A label no array has is not an error: ``free`` is idempotent, as :meth:`release` is (the
        cubie adapter frees labels that may be gone already). To check what is held, read
        ``stats().instances`` (or ``statistics().allocations``).
        """
        self._release.free(label, instance)

    def free_all(self) -> None:
        """Free every array the manager handed out (requests in flight fail with ReleasedError)."""
        self._release.free_all()

    @property
    def device(self) -> int:
        """The id of the device this manager drives."""
        return self._device.device_id

    def on_device(self) -> AbstractContextManager[Any]:
        """A context manager that makes this manager's device current in the calling thread.

        Launch kernels and CuPy work on a manager's arrays inside it when the program uses
        several devices (``with mgr.on_device(): kernel[blocks, threads, stream](...)``).
        """
        return self._device.activate()

    # -- observability ---------------------------------------------------------------------
    def stats(self) -> Snapshot:
        """Live and peak bytes, requests, batches, chunks and latencies, per group and instance."""
        self._registration.reap()
        return self._observer.stats()

    def statistics(self) -> ManagerStatistics:
        """The manager's own state now, read-only: requests by stage per group, members, arrays held,
        the size of its tables (see :class:`ManagerStatistics`). For tests and debugging."""
        self._registration.reap()
        return self._observer.statistics(self.running, *self._groups.statistics())

    def summary(self) -> str:
        """A table of :meth:`stats` to read at a glance: device and pool bytes, then per group
        and per instance live, peak and cap bytes, requests, batches, chunks, failures and the
        wait and ready latencies (median / 99th percentile), then the recovery counts."""
        return summary(self.stats())

    def reset_peaks(self, *, group: str | None = None, instance: object | None = None) -> None:
        """Peaks start again from what is held now: of ``group``, of ``instance``, or (neither given)
        all of them. :class:`RegistrationError` for an unknown group or instance."""
        self._observer.reset_peaks(group, None if instance is None else self._registration.member(instance))

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
        self._observer.record_history(enabled, max_entries=max_entries, stacks=stacks, dump_on_oom=dump_on_oom)

    def history(self) -> History:
        """The allocation history recorded so far (:class:`ConfigurationError` if none ever was)."""
        return self._observer.history()


_default: MemoryManager | None = None
_default_lock = threading.Lock()


def default_manager() -> MemoryManager:
    """The process-wide manager, created on first use (its backend: ``AIOCUBIE_BACKEND``, else "auto").

    Like any manager it serves requests inside ``async with default_manager():``.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = MemoryManager()
        return _default
