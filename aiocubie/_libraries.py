"""Other libraries sharing the account's pool: routed to it (``share``), and counted against a component's budget.

:class:`LibraryScopes` keeps one library pool per registered instance (torch's ``MemPool`` on the
shared pool, made by the resource) and, each time the instance's torch code leaves its ``with``
block, tells the account what that pool holds. It is handed the account and the registry; it
allocates nothing itself, never awaits, and never reaches back to the manager.
"""

from __future__ import annotations

import asyncio
import numbers
from collections.abc import Callable, Sequence
from types import TracebackType

from ._accounting import DeviceAccount
from ._backends import LibraryPool, require_shared_pool
from ._errors import ConfigurationError, ManagerStateError, warn
from ._registry import Member, Registry

__all__ = ["LibraryScopes", "TorchAllocations"]


def _loop_ran() -> Callable[[], bool] | None:
    """A probe of this thread's asyncio loop: the function returned says whether it ran since (None: no loop here).

    Code inside a ``with`` that awaits lets the loop run other tasks, whose torch allocations then
    land in this component's pool: the probe is how that is noticed. asyncio (and uvloop) only:
    trio runs such callbacks in a system task it schedules when it likes, so a probe there would
    warn on some awaits and not on others.
    """
    ran = [False]
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:
        return None
    handle = loop.call_soon(ran.__setitem__, 0, True)

    def asyncio_ran() -> bool:
        handle.cancel()
        return ran[0]

    return asyncio_ran


class TorchAllocations:
    """``with mgr.pool.torch_allocations(instance):`` torch's allocations in the block count against ``instance``.

    They come from a torch ``MemPool`` of the instance's own on the manager's pool (``allocator="rmm"``;
    :class:`ConfigurationError` for another allocator or without torch). When the block ends, what
    that pool holds (tensors, and segments torch keeps for reuse) counts as the instance's live bytes:
    in stats, peaks, the history and, in active mode, the headroom of its group's next batches.
    A plain ``with``, for synchronous code: torch routes the allocations of the *thread* to the
    pool while the block runs, so nothing inside may await (other tasks would allocate into it).
    ``async with`` is refused; a block that awaited anyway is warned about when it ends (on asyncio).

    Attributes
    ----------
    pool : LibraryPool
        The instance's torch pool (one per instance, kept while it is registered).
    """

    def __init__(self, scopes: LibraryScopes, member: Member, pool: LibraryPool) -> None:
        self._scopes, self._member, self.pool = scopes, member, pool
        self._probes: list[Callable[[], bool] | None] = []

    def __enter__(self) -> TorchAllocations:
        self._probes.append(_loop_ran())
        self.pool.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.pool.__exit__(kind, exc, tb)
        finally:
            self._scopes.count(self._member, self.pool)
            probe = self._probes.pop()
            if probe is not None and probe():
                warn(
                    f"{self._member.name}'s torch_allocations block awaited: while it waited, other tasks' torch "
                    "allocations in this thread went into its pool and count against it. Keep the block "
                    "synchronous (await before or after it)"
                )

    async def __aenter__(self) -> None:
        raise ManagerStateError(
            "torch_allocations is a plain `with`, not `async with`: torch routes a thread's allocations to the "
            "component's pool while the block runs, so nothing inside may await (other tasks would allocate into it)"
        )

    async def __aexit__(self, *exc: object) -> None:
        return None

    @property
    def held(self) -> int:
        """Device bytes the instance's torch pool holds now (tensors, and segments torch caches for reuse)."""
        return self.pool.held()


class LibraryScopes:
    """The library pools of the registered instances, and their bytes in the account.

    Parameters
    ----------
    account : DeviceAccount
        Makes the pools (through its resource) and counts their bytes in the ledger.
    registry : Registry
        Which instances are registered, their groups and names.
    """

    def __init__(self, account: DeviceAccount, registry: Registry) -> None:
        self._account = account
        self._registry = registry
        self._pools: dict[int, tuple[Member, LibraryPool]] = {}

    def share(self, libraries: Sequence[str], limit: int | None = None) -> None:
        """Make ``libraries`` allocate from the account's pool, capped at ``limit`` bytes together (see
        ``PoolView.share``).

        Raises
        ------
        ConfigurationError
            For a resource no other library can draw from, a library that cannot be routed, or a
            limit that is not a whole number of bytes > 0 (or a second, different one).
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit <= 0):
            raise ConfigurationError(
                f"limit must be the bytes other libraries may hold together, an int > 0 (e.g. 4 << 30), got {limit!r}"
            )
        resource = self._account.resource
        what = (
            f"cannot share the {resource.name!r} allocator's pool with {', '.join(map(repr, libraries)) or 'nothing'}"
        )
        require_shared_pool(resource, what).share_with(libraries, None if limit is None else int(limit))

    def torch(self, instance: object) -> TorchAllocations:
        """The ``with`` block whose torch allocations count against ``instance`` (see ``PoolView.torch_allocations``).

        Raises
        ------
        RegistrationError
            If ``instance`` is not registered.
        ConfigurationError
            If the allocator is not one torch can draw from (``allocator="rmm"``), or torch is missing.
        """
        member = self._registry.member(instance)
        for key, (held_by, _) in list(self._pools.items()):  # pools of instances gone (or ids reused)
            if self._registry.members.get(key) is not held_by:
                del self._pools[key]
        entry = self._pools.get(member.key)
        if entry is None:
            entry = self._pools[member.key] = (
                member,
                require_shared_pool(self._account.resource, "counting torch's allocations").library_pool("torch"),
            )
        return TorchAllocations(self, member, entry[1])

    def count(self, member: Member, pool: LibraryPool) -> None:
        """Tell the account what ``pool`` holds for ``member`` now (nothing once it has left)."""
        if self._registry.members.get(member.key) is member:
            self._account.count_library(pool, member.key, member.group, "torch", pool.held())

    def forget(self) -> None:
        """Drop every pool (the context they lived in was reset)."""
        self._pools.clear()
