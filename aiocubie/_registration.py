"""Registration: instances joining and leaving, found by instance, and reaped once collected.

Handed the registry, the device account, the stream groups and what to do with a departed
member's peak, it registers and unregisters instances and unregisters those the garbage collector
took. It keeps no table of its own (the registry and the account do) and never reaches the manager.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ._accounting import DeviceAccount
from ._errors import RegistrationError
from ._groups import StreamGroups
from ._options import parse_priority
from ._protocols import StreamLike
from ._registry import InvalidateHook, Member, ReadyHook, Registry

__all__ = ["Registration"]

log = logging.getLogger("aiocubie")


class Registration:
    """The registered instances of one manager, as the user names them.

    Parameters
    ----------
    registry : Registry
        Members and groups (it holds them).
    account : DeviceAccount
        Where a member's budget joins and leaves.
    groups : StreamGroups
        The schedulers: a new member's group gets one, a departed member's requests end.
    member_left : callable
        ``member_left(member, peak)`` when a member is unregistered holding a peak of ``peak`` bytes.
    """

    def __init__(
        self,
        registry: Registry,
        account: DeviceAccount,
        groups: StreamGroups,
        member_left: Callable[[Member, int], None],
    ) -> None:
        self._registry = registry
        self._account = account
        self._groups = groups
        self._member_left = member_left

    def register(
        self,
        instance: object,
        *,
        proportion: float | None,
        group: str,
        invalidate_hook: InvalidateHook | None,
        ready_hook: ReadyHook | None,
        name: str | None,
        owner: object,
        priority: int = 0,
    ) -> None:
        """Register ``instance`` (see ``MemoryManager.register``); nothing is half-registered on an error."""
        priority = parse_priority(priority, RegistrationError)
        self.reap()
        registry = self._registry
        settings: dict[str, Any] = dict(group=group, name=name, invalidate_hook=invalidate_hook, ready_hook=ready_hook)
        registry.check_new(instance, **settings)
        self._account.join(id(instance), proportion)  # validates the proportion
        member = registry.add(instance, **settings, priority=priority)
        if owner is not None:
            member.owner = id(owner)
        self._groups.scheduler_of(member.group)

    def unregister(self, instance: object) -> None:
        """Forget ``instance``: free its arrays, withdraw its queued requests, drop its budget."""
        self._remove(self.member(instance).key)

    def is_registered(self, instance: object) -> bool:
        """True if ``instance`` is registered."""
        self.reap()
        return id(instance) in self._registry.members

    def member(self, instance: object) -> Member:
        """The member record of ``instance`` (collected instances are unregistered first).

        Raises
        ------
        RegistrationError
            If ``instance`` is not registered.
        """
        registry = self._registry
        if registry.dead:
            self.reap()
        member = registry.members.get(id(instance))  # on every request: the lookup inline
        return registry.member(instance) if member is None else member

    def current(self, instance: object, member: Member) -> Member:
        """``member``, or ``instance``'s record if it was unregistered (and maybe registered again) since.

        Raises
        ------
        RegistrationError
            If ``instance`` is not registered now.
        """
        registry = self._registry
        if registry.dead:
            self.reap()
        if registry.members.get(member.key) is member:
            return member
        return registry.member(instance)

    def stream_of(self, instance: object) -> StreamLike:
        """The stream of ``instance``'s group."""
        return self._registry.groups[self.member(instance).group].stream

    def _remove(self, key: int) -> None:
        member = self._registry.remove(key)
        self._groups.drop(key, RegistrationError(f"{member.name} was unregistered before its request was served"))
        self._member_left(member, self._account.leave(key))
        if member.group not in self._registry.groups:
            self._groups.retire(member.group)

    def reap(self) -> None:
        """Unregister the members whose instance was garbage-collected."""
        for key in self._registry.reap():
            log.debug("unregistering collected %s", self._registry.name_of(key))
            self._remove(key)

    def reap_collected(self) -> None:
        """:meth:`reap`, as a loop callback (scheduled by the registry's finalizer): never raises."""
        try:
            self.reap()
        except Exception:
            log.exception("unregistering a collected instance failed")
