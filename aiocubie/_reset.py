"""The context reset: every array handed out made invalid, every invalidate hook called, new streams.

Handed the registry, the device account, the stream groups, the hooks and the release, it runs
``invalidate_all``, ``set_allocator`` (the account swaps the resource) and ``reinit_streams`` in
their order. None of them may run inside a reclaim hook. It never reaches the manager.
"""

from __future__ import annotations

from ._accounting import DeviceAccount
from ._backends import Allocator, allocator_or_resource
from ._errors import ContextResetError, warn
from ._groups import StreamGroups
from ._hooks import Hooks
from ._registry import Registry
from ._release import Release

__all__ = ["ContextReset"]


class ContextReset:
    """Resets of one manager's device context.

    Parameters
    ----------
    registry : Registry
        The groups, whose streams are renewed.
    account : DeviceAccount
        Swaps the memory resource; refuses a reset from inside a reclaim hook.
    groups : StreamGroups
        Fail the requests in flight.
    hooks : Hooks
        Calls the members' invalidate hooks.
    release : Release
        Frees every array.
    """

    def __init__(
        self, registry: Registry, account: DeviceAccount, groups: StreamGroups, hooks: Hooks, release: Release
    ) -> None:
        self._registry = registry
        self._account = account
        self._groups = groups
        self._hooks = hooks
        self._release = release

    def invalidate_all(self) -> None:
        """Call every invalidate hook once and release every array (see ``MemoryManager.invalidate_all``)."""
        self._account.refuse_in_reclaim("invalidate_all()")
        self._fail_in_flight("invalidate_all")
        self._release.free_all()
        self._hooks.invalidate()

    def set_allocator(self, name: Allocator) -> None:
        """Swap the memory resource to ``name`` (or a resource, or a factory), a reset (see ``MemoryManager.set_allocator``)."""
        self._account.set_resource(allocator_or_resource(name))  # first: an unknown name must not warn of a reset
        warn(f"set_allocator({name!r}) resets the device context: arrays and compiled kernels from before are invalid")
        self._fail_in_flight(f"set_allocator({name!r})")
        self.reinit_streams()
        self._hooks.invalidate()

    def reinit_streams(self) -> None:
        """Give every group a new stream (:class:`ManagerStateError` inside a reclaim hook)."""
        self._account.refuse_in_reclaim("reinit_streams()")
        self._registry.renew_streams()

    def _fail_in_flight(self, cause: str) -> None:
        self._groups.reset(
            ContextResetError(f"{cause} reset the device context while this request was in flight; request again")
        )
