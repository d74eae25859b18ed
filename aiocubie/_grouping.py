"""The stream groups as the user sees them (``mgr.groups``): streams, moves, flushes, waits.

Handed the registration (an instance's member), the stream groups, the account (no stream
renewal inside a reclaim hook), the registry (the streams), and ways to find a running manager's
stream and to wait for one.
It keeps no state of its own and never reaches the manager.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ._accounting import DeviceAccount
from ._groups import StreamGroups
from ._protocols import StreamLike
from ._registry import Members, Registry

__all__ = ["GroupsView"]


class GroupsView:
    """A manager's stream groups: ``mgr.groups``.

    Members of one group share a CUDA stream; their requests are batched and planned together.
    """

    def __init__(
        self,
        registry: Registry,
        registration: Members,
        groups: StreamGroups,
        account: DeviceAccount,
        running_stream_of: Callable[[object], StreamLike],
        wait_for: Callable[[StreamLike], Awaitable[None]],
        check_closed: Callable[[], None],
    ) -> None:
        self._registry = registry
        self._registration = registration
        self._groups = groups
        self._account = account
        self._running_stream_of = running_stream_of  # refuses once the manager exited
        self._wait_for = wait_for
        self._check_closed = check_closed  # no new stream on a backend close() closed

    def stream(self, instance: object) -> StreamLike:
        """The stream of ``instance``'s group."""
        return self._registration.stream_of(instance)

    def group_of(self, instance: object) -> str:
        """The name of ``instance``'s group."""
        return str(self._registration.member(instance).group)

    def move(self, instance: object, group: str) -> None:
        """Move ``instance`` to ``group`` (created if new).

        Its queued requests, and those waiting for memory, move with it and are planned against
        the new group's budget; those in flight finish in the old group. What it holds counts in
        the new group from then on (over its cap, that group starts no batch until back under).
        A group left empty is forgotten, its stream and scheduler task released.
        """
        member = self._registration.member(instance)
        if isinstance(group, str) and group not in self._registry.groups:  # a bad name: refused by the move
            self._check_closed()
        self._groups.move(member, group)

    def is_grouped(self, instance: object) -> bool:
        """True if ``instance`` shares its group with another instance."""
        return self._groups.is_grouped(self._registration.member(instance))

    def members(self) -> dict[str, list[str]]:
        """Group name -> the names of its members."""
        self._registration.reap()  # a collected instance is no member
        return self._groups.names()

    def flush(self, group: str | None = None) -> None:
        """Close the batch being collected in ``group`` (every group if None) now."""
        self._groups.flush(group)

    async def sync(self, instance: object) -> None:
        """Wait until everything queued on ``instance``'s stream is done (without blocking the loop)."""
        await self._wait_for(self._running_stream_of(instance))

    def reinit_streams(self) -> None:
        """Give every group a new stream (after a context reset).

        :class:`ManagerStateError` inside a reclaim hook (see :meth:`PoolView.add_reclaim_hook
        <aiocubie.PoolView.add_reclaim_hook>`).
        """
        self._account.refuse_in_reclaim("reinit_streams()")
        self._check_closed()
        self._registry.renew_streams()
