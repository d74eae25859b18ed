"""The request entry: a request checked when it is made, submitted when it is awaited, or allocated now.

Handed the registration, the device account, the stream groups, a way to free the labels a request replaces, the serving loop
and what to raise when the manager does not serve, it checks what a user asks for and hands it
to the groups. It queues, plans and allocates nothing itself, and never reaches the manager.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from operator import is_
from threading import get_ident

import numpy as np

from ._accounting import DeviceAccount
from ._completion import Loop
from ._errors import InvalidRequestError, ManagerStateError, shown
from ._groups import PendingRequest, StreamGroups
from ._options import parse_priority
from ._registry import Member, Members
from ._requests import ArrayRequest, ArrayResponse, RequestSet, check_requests
from ._serving import Serving

__all__ = ["RequestEntry"]

#: Request dicts whose checked form is kept (see ``RequestEntry._checked``): a few loaders' each.
_CHECKED_SETS = 16


class RequestEntry:
    """Where a user's requests come in.

    Parameters
    ----------
    registration : Members
        Finds the member of an instance.
    account : DeviceAccount
        Refuses an allocation from inside a reclaim hook.
    groups : StreamGroups
        Serves a request, or allocates it now.
    replace : callable
        Frees the arrays a replacing request replaces; a response's arrays.
    serving : Serving
        The loop a request is awaited in.
    refusal : callable
        ``refusal(loop)``: the ManagerStateError for a request awaited while the manager does not
        serve in the calling thread (``loop``: the serving loop, or None).
    check_streams : callable
        Raises ManagerStateError once the streams were closed with the backend (an allocation now
        would be queued on them).
    """

    def __init__(
        self,
        registration: Members,
        account: DeviceAccount,
        groups: StreamGroups,
        replace: Callable[[Member, RequestSet], None],
        serving: Serving,
        refusal: Callable[[Loop | None], ManagerStateError],
        check_streams: Callable[[], None],
    ) -> None:
        self._registration = registration
        self._account = account
        self._groups = groups
        self._replace = replace
        self._serving = serving
        self._refusal = refusal
        self._check_streams = check_streams
        # id(dict) -> (the dict, its labels, its requests, its RequestSet): a loader's requests,
        # made once and asked for batch after batch, are checked once (see :meth:`_checked`)
        self._checked_sets: dict[int, tuple[object, tuple[str, ...], tuple[ArrayRequest, ...], RequestSet]] = {}

    def request(
        self,
        instance: object,
        requests: Mapping[str, ArrayRequest],
        replace: bool,
        ordered: bool,
        priority: int | None = None,
    ) -> PendingRequest:
        """A request checked now, submitted when awaited (see ``MemoryManager.request``)."""
        if replace is not False and replace is not True:  # the flags checked without a call when plain
            replace = _flag("replace", replace)
        if ordered is not False and ordered is not True:
            ordered = _flag("ordered", ordered)
        if priority is not None:
            priority = parse_priority(priority, InvalidRequestError)
        cached = self._checked_sets.get(id(requests))  # the hit of _checked, inline: a stream's every batch
        if (
            cached is not None
            and cached[0] is requests
            and tuple(requests) == cached[1]
            and all(map(is_, requests.values(), cached[2]))
        ):
            checked = cached[3]
        else:
            checked = self._checked(requests)
        member = self._registration.member(instance)
        # an `async with` releases its response through the account: it is an ArrayResponse
        return PendingRequest(self._serve, self._account.release, instance, member, checked, replace, ordered, priority)

    def _checked(self, requests: Mapping[str, ArrayRequest]) -> RequestSet:
        """``requests`` checked (see :func:`check_requests`), kept for the next request of the same dict.

        A plain dict asked for again, holding the same labels (in the same order) and the very
        same ArrayRequest objects (immutable), gets the RequestSet made the first time (see
        :meth:`request`): compared in C, never calling a value's ``__eq__``. Anything else is
        checked again; other mappings are checked every time.
        """
        checked = check_requests(requests)
        if type(requests) is dict:
            sets = self._checked_sets
            if len(sets) >= _CHECKED_SETS:
                del sets[next(iter(sets))]  # the oldest
            sets[id(requests)] = (requests, tuple(requests), tuple(requests.values()), checked)
        return checked

    def _serve(
        self,
        instance: object,
        member: Member,
        requests: RequestSet,
        replace: bool = False,
        ordered: bool = False,
        holder: PendingRequest | None = None,
        priority: int | None = None,
    ) -> Awaitable[ArrayResponse]:
        """What PendingRequest awaits: the request submitted and waited for (no coroutine of its own:
        one level less on the hot path)."""
        loop = self._serving.loop
        if loop is None or loop.thread != get_ident():
            raise self._refusal(loop)
        member = self._registration.current(instance, member)  # unregistered since request()?
        if replace:
            self._replace(member, requests)
        return self._groups.serve(member, requests, loop, ordered, holder, priority)

    def allocate_all(self, instance: object, requests: Mapping[str, ArrayRequest], replace: bool) -> ArrayResponse:
        """Allocate ``requests`` now, unbatched and unchunked (see ``MemoryManager.allocate``)."""
        self._account.refuse_in_reclaim("allocate()")
        self._check_streams()
        checked = self._checked(requests)
        member = self._registration.member(instance)
        if _flag("replace", replace):
            self._replace(member, checked)
        return self._groups.allocate_now(member, checked)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidRequestError(f"{name} takes True or False, got {shown(value)}")
    return bool(value)
