"""The registry: registered instances (members) and the stream groups they belong to.

Members are held weakly where the instance allows it, and so are their hooks when a hook is
the instance itself or one of its bound methods (``comp.on_ready``). When an instance is
collected its key is queued for the manager to unregister on the loop thread
(:meth:`Registry.reap`), and :attr:`Registry.on_collected` is called (from whatever thread
collected it) so the manager can schedule that at once. The registry makes a group's stream
when the group is first named and forgets a group when its last member leaves. It holds no
budget, arrays or tasks.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs

from ._errors import RegistrationError
from ._protocols import StreamLike, is_async_callable
from ._requests import ArrayResponse
from ._stats import Counters, Telemetry

__all__ = [
    "CopyStreams",
    "Group",
    "InvalidateHook",
    "Member",
    "Members",
    "ReadyHook",
    "Registry",
    "await_hook",
    "call_hook",
    "is_async_callable",
]

log = logging.getLogger("aiocubie")

InvalidateHook = Callable[[], Any]
ReadyHook = Callable[[ArrayResponse], Any]


@attrs.define(eq=False)
class Member:
    """A registered instance.

    Its hooks are read through :attr:`invalidate_hook` and :attr:`ready_hook`: a hook held
    weakly (a bound method of the instance, or the instance itself) reads None once the
    instance is gone. ``ready_async`` / ``invalidate_async``: the hook is an ``async def``
    function or an object with an ``async def __call__`` (worked out once, at registration).
    """

    key: int
    name: str
    group: str
    keepalive: object  # the instance itself when it cannot be weakly referenced, else None
    _invalidate: Any  # the hook, or a weak reference to it (see _hold)
    _ready: Any
    finalizer: weakref.finalize | None  # type: ignore[type-arg]
    counters: Counters
    invalidate_async: bool = False
    ready_async: bool = False
    has_ready_hook: bool = False
    #: ``id`` of the owner it was registered with (None: no owner, told every batch's plan).
    owner: int | None = None
    #: Its requests' priority when they name none, and where their queue waits are sampled.
    priority: int = 0
    waits: deque[float] | None = None

    @property
    def owner_key(self) -> int:
        """The owner it asks for: its owner, or itself when it has none."""
        return self.key if self.owner is None else self.owner

    @property
    def invalidate_hook(self) -> InvalidateHook | None:
        """The invalidate hook (None if there is none, or its instance was collected)."""
        hook: InvalidateHook | None = _deref(self._invalidate)
        return hook

    @property
    def ready_hook(self) -> ReadyHook | None:
        """The allocation-ready hook (None if there is none, or its instance was collected)."""
        hook: ReadyHook | None = _deref(self._ready)
        return hook


class _Weak:
    """A hook held weakly: ``ref()`` gives the callable, or None once its instance is gone."""

    __slots__ = ("ref",)

    def __init__(self, ref: Callable[[], Any]) -> None:
        self.ref = ref


def _deref(held: Any) -> Any:
    return held.ref() if type(held) is _Weak else held


def _hold(hook: Any, instance: object) -> Any:
    """``hook`` as the member keeps it: weakly when holding it would keep ``instance`` alive."""
    if hook is None:
        return None
    try:
        if hook is instance:
            return _Weak(weakref.ref(instance))
        if inspect.ismethod(hook) and hook.__self__ is instance:
            return _Weak(weakref.WeakMethod(hook))
    except TypeError:  # not weak-referenceable: the member holds the instance anyway
        pass
    return hook


class CopyStreams:
    """The two copy streams (in, out) of one group stream, made on first use.

    A walk of several chunks overlaps its copies with the body's work on them (see
    ``aiocubie._walks``); the group owns them beside its stream, and every response allocated
    on that stream hands them to its walks.

    Parameters
    ----------
    create_stream : callable
        Makes a stream on the group's device.
    """

    __slots__ = ("_create_stream", "_streams")

    def __init__(self, create_stream: Callable[[], StreamLike]) -> None:
        self._create_stream = create_stream
        self._streams: tuple[StreamLike, StreamLike] | None = None

    def __call__(self) -> tuple[StreamLike, StreamLike]:
        """The (in, out) copy streams, made the first time they are asked for."""
        streams = self._streams
        if streams is None:
            streams = self._streams = (self._create_stream(), self._create_stream())
        return streams


@attrs.define(eq=False)
class Group:
    """A stream group: its stream and that stream's copy streams, its members' keys and its counters."""

    name: str
    stream: StreamLike
    counters: Counters
    copy_streams: CopyStreams
    members: set[int] = attrs.field(factory=set)
    hooks: int = 0  # members with a ready hook: resolution skips the hooks when there are none


class Members(Protocol):
    """Finds the member of an instance, unregistering collected instances first.

    The registration is one; the manager's parts are handed it as this, so none of them stands
    on it.
    """

    def member(self, instance: object) -> Member:
        """The member record of ``instance`` (RegistrationError if it is not registered)."""

    def current(self, instance: object, member: Member) -> Member:
        """``member``, or ``instance``'s record if it was unregistered (and registered again) since."""

    def stream_of(self, instance: object) -> StreamLike:
        """The stream of ``instance``'s group."""

    def reap(self) -> None:
        """Unregister the members whose instance was garbage-collected."""

    def reap_collected(self) -> None:
        """:meth:`reap`, as a loop callback: never raises."""


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
        #: Keys of collected instances, reaped on the loop thread (:meth:`reap`); empty on most calls.
        self.dead: deque[int] = deque()
        self._names = 0
        #: Called with no argument, from the collecting thread, when a member's instance is
        #: collected (None: nobody is told; the next manager call reaps it).
        self.on_collected: Callable[[], None] | None = None

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
        priority: int = 0,
    ) -> Member:
        """Record ``instance`` as a member of ``group`` (made if new), after :meth:`check_new`."""
        self.check_new(instance, group=group, name=name, invalidate_hook=invalidate_hook, ready_hook=ready_hook)
        key = id(instance)
        if name is None:
            name = self._default_name(instance)
        try:
            finalizer: weakref.finalize | None = weakref.finalize(instance, self._collected, key)  # type: ignore[type-arg]
            keepalive = None
        except TypeError:  # not weak-referenceable: hold it, so no other object takes its id
            finalizer, keepalive = None, instance
        member = Member(
            key,
            name,
            group,
            keepalive,
            _hold(invalidate_hook, instance),
            _hold(ready_hook, instance),
            finalizer,
            self._telemetry.instance(name),
            invalidate_async=is_async_callable(invalidate_hook),
            ready_async=is_async_callable(ready_hook),
            has_ready_hook=ready_hook is not None,
            priority=priority,
            waits=self._telemetry.waits(priority),
        )
        self.members[key] = member
        self._join(member, self.ensure_group(group))
        return member

    def waits(self, priority: int) -> deque[float]:
        """Where the queue waits of requests of ``priority`` are sampled."""
        return self._telemetry.waits(priority)

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
            If it is None or a plain value (a number, string, bytes, tuple), registered already, a
            hook is not callable, or a name is taken or bad.
        """
        if instance is None or isinstance(instance, _VALUES):
            raise RegistrationError(
                f"register the component object itself (an instance of your class), not "
                f"{type(instance).__name__} {instance!r:.40}: equal values may be one object, so they could not "
                "be told apart (to name a component, pass name=...)"
            )
        key = id(instance)
        if key in self.members:
            raise RegistrationError(f"{self.members[key].name} is already registered")
        check_group_name(group)
        for label, hook in (("invalidate_hook", invalidate_hook), ("ready_hook", ready_hook)):
            if hook is not None and not callable(hook):
                raise RegistrationError(f"{label} must be callable, got {hook!r}")
        if name is not None and not isinstance(name, str):
            raise RegistrationError(f"name must be a string, got {name!r}")
        if name is not None:
            _check_encodable(name, "name")
        if name is not None and any(m.name == name for m in self.members.values()):
            raise RegistrationError(f"the name {name!r} is taken by another registered instance: pick another")

    def _collected(self, key: int) -> None:
        # a weakref finalizer: runs in whatever thread collected the instance, at any point
        # of that thread's work, so it only queues the key and tells the manager
        self.dead.append(key)
        notify = self.on_collected
        if notify is not None:
            notify()

    def remove(self, key: int) -> Member:
        """Forget member ``key``; return its record. Its group is forgotten if it was the last one."""
        member = self.members.pop(key)
        if member.finalizer is not None:
            member.finalizer.detach()
        self._leave(member, self.groups[member.group])
        return member

    def move(self, member: Member, group: str) -> tuple[Group, Group]:
        """Move ``member`` to ``group`` (made if new); return the old and the new group.

        The old group is forgotten if ``member`` was its last one (check ``old.name in groups``).
        """
        check_group_name(group)
        old = self.groups[member.group]
        new = self.ensure_group(group)
        if old is not new:
            self._join(member, new)
            self._leave(member, old)
            member.group = group
        return old, new

    @staticmethod
    def _join(member: Member, group: Group) -> None:
        group.members.add(member.key)
        group.hooks += member.has_ready_hook

    def _leave(self, member: Member, group: Group) -> None:
        if member.key in group.members:
            group.members.discard(member.key)
            group.hooks -= member.has_ready_hook
        if not group.members and self.groups.get(group.name) is group:
            # an empty group keeps nothing: its stream goes once nothing in flight uses it
            del self.groups[group.name]
            self._telemetry.retire_group(group.name)

    def ensure_group(self, name: str) -> Group:
        """The group called ``name``, made (with a new stream) if it does not exist."""
        group = self.groups.get(name)
        if group is None:
            create = self._create_stream
            group = self.groups[name] = Group(name, create(), self._telemetry.group(name), CopyStreams(create))
        return group

    def renew_streams(self) -> None:
        """Give every group a new stream (after a context reset)."""
        for group in self.groups.values():
            group.stream = self._create_stream()
            group.copy_streams = CopyStreams(self._create_stream)

    def reap(self) -> list[int]:
        """Keys of members whose instance was collected since the last call, still registered."""
        dead = []
        while self.dead:
            key = self.dead.popleft()
            if key in self.members:
                dead.append(key)
        return dead


#: Values, not components: Python may share one object between equal values (small ints, interned
#: strings), so two "components" could be one registration.
_VALUES = (bool, int, float, complex, str, bytes, tuple, frozenset, range)


def check_group_name(name: object) -> None:
    """Raise RegistrationError unless ``name`` is a non-empty string."""
    if not isinstance(name, str) or not name:
        raise RegistrationError(f"stream group names are non-empty strings, got {name!r}")
    _check_encodable(name, "stream group name")


def _check_encodable(name: str, what: str) -> None:
    """Names go into logs, JSON and pictures: refuse what UTF-8 cannot write (a lone surrogate)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RegistrationError(
            f"the {what} {name!r} cannot be written as UTF-8 ({exc.reason} at position {exc.start}): "
            "use a name of plain text"
        ) from None


async def call_hook(hook: Callable[..., Awaitable[Any]], args: tuple[Any, ...], what: str) -> None:
    """Call and await an async hook; log what it raises (a hook never stops the service)."""
    try:
        await hook(*args)
    except Exception:
        log.exception("%s raised; the service goes on", what)


async def await_hook(awaitable: Awaitable[Any], what: str) -> None:
    """Await what a hook returned; log what it raises."""
    try:
        await awaitable
    except Exception:
        log.exception("%s raised; the service goes on", what)
