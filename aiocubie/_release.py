"""Release: the arrays a user gives back, by response, by label, all of them, or replaced by a new request.

Handed the registration (to find an instance), the device account and the stream groups, it
says what to free and lets the groups fail the requests in flight that held it. The account
does the freeing; this keeps no state and never reaches the manager.
"""

from __future__ import annotations

from ._accounting import DeviceAccount
from ._errors import InvalidRequestError, shown
from ._groups import PendingRequest, StreamGroups
from ._registry import Member, Members
from ._requests import ArrayResponse, RequestSet

__all__ = ["Release"]


class Release:
    """Frees arrays on a user's call.

    Parameters
    ----------
    registration : Members
        Finds the member of an instance.
    account : DeviceAccount
        Releases a response's arrays.
    groups : StreamGroups
        Frees arrays by a predicate and fails the requests in flight that held them.
    """

    def __init__(self, registration: Members, account: DeviceAccount, groups: StreamGroups) -> None:
        self._registration = registration
        self._account = account
        self._groups = groups

    def release(self, response: ArrayResponse) -> None:
        """Free the arrays of ``response`` (see ``MemoryManager.release``); nothing if released already.

        Raises
        ------
        InvalidRequestError
            For a request that was never awaited, or anything but a response this manager handed
            out (an array, the ``arrays`` dict, a label, None, another manager's response).
        """
        # one isinstance and one ledger lookup on the usual call (the release of a stream's every batch):
        # the account says whether it held the response, so the checks of a bad argument come after
        if isinstance(response, ArrayResponse):
            if self._account.release(response) or response.released.issuperset(response.arrays):
                return  # released here, or released already (twice is a no-op)
            raise InvalidRequestError(
                "release() was given a response this manager did not hand out (another manager's, or one "
                "built by hand): release it with the manager that handed it out"
            )
        if isinstance(response, PendingRequest):
            raise InvalidRequestError(
                "release() was given a request that was not awaited, not an ArrayResponse: write "
                "`response = await mgr.request(...)` first (or `async with mgr.request(...) as response:`, "
                "which releases on exit)"
            )
        given = "a label" if isinstance(response, str) else f"of type {type(response).__name__}"
        raise InvalidRequestError(
            f"release() takes the ArrayResponse a request resolved to, got {shown(response)} ({given}): "
            "pass the response itself (mgr.release(response)), or free one label's arrays with "
            "mgr.free(label, instance)"
        )

    def free(self, label: str, instance: object | None) -> None:
        """Free the arrays labelled ``label``: ``instance``'s only, or (None) every instance's."""
        if instance is None:
            self._groups.free_where(lambda a: a.label == label, f"free({label!r})")
        else:
            key = self._registration.member(instance).key
            self._groups.free_where(lambda a: a.label == label and a.key == key, f"free({label!r}, instance)")

    def free_all(self) -> None:
        """Free every array handed out (requests in flight fail with ReleasedError)."""
        self._groups.free_where(lambda a: True, "free_all()")

    def replace(self, member: Member, requests: RequestSet) -> None:
        """Free ``member``'s arrays of the labels ``requests`` asks for (a replacing request)."""
        labels, key = requests.arrays.keys(), member.key
        self._groups.free_where(lambda a: a.key == key and a.label in labels, "a request replacing its labels")
