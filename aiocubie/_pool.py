"""The memory pool as the user drives it (``mgr.pool``): the allocator, the context resets it
takes, pool sharing with other libraries, and the reclaim hooks for out-of-memory.

Handed the registry, the device account, the stream groups, the hooks, a way to free every
array and the library scopes. A reset (``set_allocator``, ``invalidate_all``) may not run inside a reclaim
hook. It keeps no state of its own and never reaches the manager.
"""

from __future__ import annotations

from collections.abc import Callable

from ._accounting import DeviceAccount
from ._backends import Allocator, MemoryInfo, allocator_or_resource
from ._errors import ContextResetError, warn
from ._groups import StreamGroups
from ._hooks import Hooks
from ._libraries import LibraryScopes, TorchAllocations
from ._recovery import ReclaimHook
from ._registry import Registry

__all__ = ["PoolView"]


class PoolView:
    """A manager's memory pool: ``mgr.pool``."""

    def __init__(
        self,
        registry: Registry,
        account: DeviceAccount,
        groups: StreamGroups,
        hooks: Hooks,
        free_all: Callable[[], None],
        libraries: LibraryScopes,
    ) -> None:
        self._registry = registry
        self._account = account
        self._groups = groups
        self._hooks = hooks
        self._free_all = free_all
        self._libraries = libraries

    @property
    def allocator(self) -> str:
        """The memory resource in use: ``"driver"``, ``"cupy"``, ``"cupy_async"``, ``"numba"`` or ``"rmm"``."""
        return self._account.resource_name

    def memory_info(self) -> MemoryInfo:
        """Free and total device memory, read now (blocks the allocator's pool caches count as free)."""
        return self._account.memory_info()

    def set_allocator(self, name: Allocator) -> None:
        """Swap the memory resource: a registered name (``"default"``, ``"driver"``, ``"cupy"``,
        ``"cupy_async"``, ``"numba"``, ``"rmm"``, see :func:`aiocubie.mr.allocator_names`), a
        resource made on this device, or a factory called with the device (see :mod:`aiocubie.mr`).

        The swap resets the device context: every array handed out before is invalid, requests
        in flight fail with :class:`ContextResetError`, every invalidate hook is called once and
        every group gets a new stream; queued requests are served on the new context.
        :class:`UnknownAllocatorError` for an unknown or unavailable allocator (nothing is reset);
        :class:`ManagerStateError` inside a reclaim hook (see :meth:`add_reclaim_hook`).
        """
        self._account.set_resource(allocator_or_resource(name))  # first: an unknown name must not warn of a reset
        said = repr(name if isinstance(name, str) else self._account.resource_name)  # a resource by its name
        warn(f"set_allocator({said}) resets the device context: arrays and compiled kernels from before are invalid")
        self._fail_in_flight(f"set_allocator({said})")
        self._registry.renew_streams()
        self._hooks.invalidate()
        self._libraries.forget()  # their pools were of the old resource

    def invalidate_all(self) -> None:
        """Call every invalidate hook once and release every array.

        Requests in flight fail with :class:`ContextResetError`; queued ones are served later.
        :class:`ManagerStateError` inside a reclaim hook (see :meth:`add_reclaim_hook`).
        """
        self._account.refuse_in_reclaim("invalidate_all()")
        self._fail_in_flight("invalidate_all")
        self._free_all()
        self._hooks.invalidate()

    def _fail_in_flight(self, cause: str) -> None:
        self._groups.reset(
            ContextResetError(f"{cause} reset the device context while this request was in flight; request again")
        )

    def share(self, *libraries: str, limit: int | None = None) -> None:
        """Make ``libraries`` (``"cupy"``, ``"numba"``, ``"torch"``) allocate from this pool.

        Needs ``allocator="rmm"``; process-wide, through RMM's hooks; torch only before its first
        CUDA allocation. Their bytes show in ``mgr.stats()`` (``other_bytes``), their
        out-of-memory failures run the reclaim hooks; ``limit``: a hard cap inside the allocator
        on what they hold together (set once).
        """
        self._libraries.share(libraries, limit)

    def torch_allocations(self, instance: object) -> TorchAllocations:
        """``with mgr.pool.torch_allocations(instance):`` torch's tensors made in the block count
        against ``instance`` (synchronous code only: nothing inside may await)."""
        return self._libraries.torch(instance)

    def add_reclaim_hook(self, hook: ReclaimHook) -> None:
        """Call ``hook(nbytes)`` when an allocation is out of memory even with the pool's cache freed.

        The hook frees what it can (``mgr.release``, ``mgr.free``, spilling to the host) and
        returns the bytes it freed, or None if it cannot say; the allocation is then tried once
        more. Hooks run in the order added, synchronously on the allocation's path: they must
        not block long. One that raises is logged and skipped. The manager holds ``hook`` until
        :meth:`remove_reclaim_hook`; :class:`ConfigurationError` if it is not callable.

        An ``async def hook(nbytes) -> int`` (or an object with ``async def __call__``) is
        awaited instead, in the group's task, before a batch that does not fit whole in what
        it is offered waits, chunks or fails (once a batch; ``nbytes``: what it lacks); then the
        batch is planned again. A round of async hooks ends after the manager's
        ``reclaim_timeout`` (default 1 s): the hook awaited then is cancelled and logged, and
        the batch goes on. It may do anything a task may, but a request it awaits in the same
        group waits behind the batch it runs for (until the deadline). See
        docs/concepts/priorities.md.

        A hook may release memory: ``mgr.release``, ``mgr.free``, ``mgr.free_all``,
        ``mgr.unregister``, ``mgr.groups.move`` (a request of a member it unregisters fails
        with RegistrationError; one of a member it moves is served by the new group). It may
        not allocate (``mgr.allocate``) or reset the context (:meth:`invalidate_all`,
        :meth:`set_allocator`, ``mgr.groups.reinit_streams``): those raise
        :class:`ManagerStateError` in the hook, naming the allocation it runs for, and unless
        the hook catches it the batch fails with it (counted as failed).

        Hooks are consulted only when the device itself is out of memory (the allocation
        failed), not when the planner finds the request larger than the group is offered (that
        raises a PlanningError, chunks, or waits, by the policy): release memory before asking.
        """
        self._hooks.add_reclaim(hook)

    def remove_reclaim_hook(self, hook: ReclaimHook) -> None:
        """Stop calling ``hook`` (nothing if it was not added)."""
        self._hooks.remove_reclaim(hook)
