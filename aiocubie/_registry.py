"""The registry: registered instances (members) and the stream groups they belong to.

Members are held weakly where the instance allows it; when one is collected its key is queued
for the manager to unregister on the loop thread (:meth:`Registry.reap`). The registry makes
a group's stream when the group is first named. It holds no budget, arrays or tasks.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from ._errors import RegistrationError
from ._requests import ArrayResponse
from ._stats import Counters, Telemetry

__all__ = ["Group", "InvalidateHook", "Member", "ReadyHook", "Registry"]

InvalidateHook = Callable[[], Any]
ReadyHook = Callable[[ArrayResponse], Any]


@attrs.define(eq=False)
class Member:
    """A registered instance."""

    key: int
    name: str
    group: str
    keepalive: object  # the instance itself when it cannot be weakly referenced, else None
    invalidate_hook: InvalidateHook | None
    ready_hook: ReadyHook | None
    finalizer: weakref.finalize | None  # type: ignore[type-arg]
    counters: Counters


@attrs.define(eq=False)
class Group:
    """A stream group: its stream, its members' keys and its counters."""

    name: str
    stream: Any
    counters: Counters
    members: set[int] = attrs.field(factory=set)
    hooks: int = 0  # members with a ready hook: resolution skips the hooks when there are none


class Registry:
    """Members by key (``id(instance)``) and groups by name.

    Parameters
    ----------
    create_stream : callable
        Makes the stream of a new group.
    telemetry : Telemetry
        Supplies the counters of each group and member.
    """

    def __init__(self, create_stream: Callable[[], Any], telemetry: Telemetry) -> None:
        self.members: dict[int, Member] = {}
        self.groups: dict[str, Group] = {}
        self._create_stream = create_stream
        self._telemetry = telemetry
        self._dead: deque[int] = deque()  # keys of collected instances, reaped on the loop thread
        self._names = 0

    # -- lookups -----------------------------------------------------------------------------
    def member(self, instance: object) -> Member:
        """The member record of ``instance``.

        Raises
        ------
        RegistrationError
            If ``instance`` is not registered.
        """
        member = self.members.get(id(instance))
        if member is None:
            raise RegistrationError(
                f"{type(instance).__name__} object at {id(instance):#x} is not registered: "
                "call mgr.register(instance) first"
            )
        return member

    def group(self, name: object) -> Group:
        """The group called ``name``.

        Raises
        ------
        RegistrationError
            If there is no such group, or ``name`` is not a non-empty string.
        """
        check_group_name(name)  # an unhashable name would raise TypeError below
        group = self.groups.get(name)  # type: ignore[call-overload]
        if group is None:
            known = ", ".join(map(repr, self.groups)) or "none"
            raise RegistrationError(f"no stream group {name!r} (known: {known})")
        return group  # type: ignore[no-any-return]

    def name_of(self, key: int) -> str:
        """The name of member ``key`` (for messages)."""
        member = self.members.get(key)
        return "an unregistered instance" if member is None else member.name

    # -- changes -----------------------------------------------------------------------------
    def add(
        self,
        instance: object,
        *,
        group: str,
        name: str | None,
        invalidate_hook: InvalidateHook | None,
        ready_hook: ReadyHook | None,
    ) -> Member:
        """Record ``instance`` as a member of ``group`` (made if new), after :meth:`check_new`."""
        self.check_new(instance, group=group, name=name, invalidate_hook=invalidate_hook, ready_hook=ready_hook)
        key = id(instance)
        if name is None:
            name = self._default_name(instance)
        try:
            finalizer: weakref.finalize | None = weakref.finalize(instance, self._dead.append, key)  # type: ignore[type-arg]
            keepalive = None
        except TypeError:  # not weak-referenceable: hold it, so no other object takes its id
            finalizer, keepalive = None, instance
        member = Member(
            key, name, group, keepalive, invalidate_hook, ready_hook, finalizer, self._telemetry.instance(name)
        )
        self.members[key] = member
        self._join(member, self.ensure_group(group))
        return member

    def _default_name(self, instance: object) -> str:
        """``Type#n`` with the next ``n`` no member is called (an explicit name may be ``Type#n``)."""
        taken = {member.name for member in self.members.values()}
        while True:
            self._names += 1
            name = f"{type(instance).__name__}#{self._names}"
            if name not in taken:
                return name

    def check_new(
        self,
        instance: object,
        *,
        group: str,
        name: str | None,
        invalidate_hook: InvalidateHook | None,
        ready_hook: ReadyHook | None,
    ) -> None:
        """Check that :meth:`add` would accept these, changing nothing.

        Raises
        ------
        RegistrationError
            If it is registered already, a hook is not callable, or a name is taken or bad.
        """
        key = id(instance)
        if key in self.members:
            raise RegistrationError(f"{self.members[key].name} is already registered")
        check_group_name(group)
        for label, hook in (("invalidate_hook", invalidate_hook), ("ready_hook", ready_hook)):
            if hook is not None and not callable(hook):
                raise RegistrationError(f"{label} must be callable, got {hook!r}")
        if name is not None and not isinstance(name, str):
            raise RegistrationError(f"name must be a string, got {name!r}")
        if name is not None and any(m.name == name for m in self.members.values()):
            raise RegistrationError(f"the name {name!r} is taken by another registered instance: pick another")

    def remove(self, key: int) -> Member:
        """Forget member ``key``; return its record."""
        member = self.members.pop(key)
        if member.finalizer is not None:
            member.finalizer.detach()
        self._leave(member, self.groups[member.group])
        return member

    def move(self, member: Member, group: str) -> tuple[Group, Group]:
        """Move ``member`` to ``group`` (made if new); return the old and the new group."""
        check_group_name(group)
        old = self.groups[member.group]
        new = self.ensure_group(group)
        self._leave(member, old)
        self._join(member, new)
        member.group = group
        return old, new

    @staticmethod
    def _join(member: Member, group: Group) -> None:
        group.members.add(member.key)
        group.hooks += member.ready_hook is not None

    @staticmethod
    def _leave(member: Member, group: Group) -> None:
        if member.key in group.members:
            group.members.discard(member.key)
            group.hooks -= member.ready_hook is not None

    def ensure_group(self, name: str) -> Group:
        """The group called ``name``, made (with a new stream) if it does not exist."""
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = Group(name, self._create_stream(), self._telemetry.group(name))
        return group

    def renew_streams(self) -> None:
        """Give every group a new stream (after a context reset)."""
        for group in self.groups.values():
            group.stream = self._create_stream()

    def reap(self) -> list[int]:
        """Keys of members whose instance was collected since the last call, still registered."""
        dead = []
        while self._dead:
            key = self._dead.popleft()
            if key in self.members:
                dead.append(key)
        return dead


def check_group_name(name: object) -> None:
    """Raise RegistrationError unless ``name`` is a non-empty string."""
    if not isinstance(name, str) or not name:
        raise RegistrationError(f"stream group names are non-empty strings, got {name!r}")
