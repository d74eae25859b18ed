"""A response's lease: what it holds of its account, and the only writer of what changes in a response.

The account hands each response a lease: the released labels, the walks under way, the frees that
wait for them, and the views walks reuse. The lease replaces released arrays by :class:`ReleasedArray`
and calls its account to release; it never allocates and knows nothing of the ledger or the loop.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import numpy as np

from ._errors import ReleasedError, SpilledError

__all__ = ["Lease", "ReleasedArray", "Releaser", "Spillable", "SpilledArray", "WalkLog"]


class WalkLog(Protocol):
    """Where walks record their steps: the allocation history while one records."""

    def walked(self, response: object, step: str, index: int) -> None:
        """A walk over ``response`` reached ``step`` of chunk ``index``."""


class Releaser(Protocol):
    """What a lease releases through: the account that handed it out."""

    def release(self, response: Any) -> object:
        """Free the arrays of ``response`` (nothing if it was released); what it returns is not used."""

    @property
    def history(self) -> WalkLog | None:
        """Where its walks record their steps now (None: no history records)."""


class Spillable(Protocol):
    """What a lease of spillable arrays holds beside them: their spill state (``_spill.SpillRecord``)."""

    def use(self) -> AbstractAsyncContextManager[dict[str, Any]]:
        """The arrays made resident and pinned while the block runs."""

    def released(self, labels: Iterable[str]) -> None:
        """The arrays of ``labels`` were freed: drop their host copies."""


@asynccontextmanager
async def _as_they_are(arrays: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield arrays


class Lease:
    """What one response holds of its account: released labels, walks in flight, frees waiting for them.

    Parameters
    ----------
    arrays, buffers : dict
        The response's arrays and chunk buffers (the same dicts): a release replaces what they hold.
    account : Releaser or None
        Where :meth:`release` goes (None: a response built by hand, which holds nothing to free).
    stand_ins : dict or None
        Label -> the :class:`ReleasedArray` that replaces each array when all are released at
        once, made beforehand and shared by responses (None: made on release).

    Attributes
    ----------
    released : set of str or None
        The labels whose arrays were freed (None until the first: a walk checks it every chunk).
    walks : int
        Walks over the arrays under way: a free waits until none is (their copies use the blocks).
    views : dict or None
        What every walk of a batch stream asks again, worked out on the first (dropped on release).
    spill : Spillable or None
        The spill state of its spillable arrays (None: it has none; the account sets it).
    priority : int
        The priority its arrays are spilled at (lowest first): its request's.
    """

    __slots__ = (
        "_account",
        "_arrays",
        "_buffers",
        "_deferred",
        "_stand_ins",
        "priority",
        "released",
        "spill",
        "views",
        "walks",
    )

    def __init__(
        self,
        arrays: dict[str, Any],
        buffers: dict[str, tuple[Any, ...]],
        account: Releaser | None,
        stand_ins: dict[str, ReleasedArray] | None = None,
    ) -> None:
        self._arrays, self._buffers, self._account = arrays, buffers, account
        self._stand_ins = stand_ins
        self.released: set[str] | None = None
        self.walks = 0
        self._deferred: list[Callable[[], None]] | None = None
        self.views: dict[str, Any] | None = None
        self.spill: Spillable | None = None
        self.priority = 0

    @property
    def walked(self) -> Callable[[object, str, int], None] | None:
        """``walked(response, step, chunk)`` records a walk's steps in the history recording now (None: none).

        Read when a walk starts: a history started or stopped since the allocation is the one it records to.
        """
        history = None if self._account is None else self._account.history
        return None if history is None else history.walked

    def release(self, response: object) -> None:
        """Free ``response``'s arrays through the account (nothing if released, or built by hand)."""
        if self._account is not None:
            self._account.release(response)

    def mark_released(self, labels: Iterable[str]) -> None:
        """The arrays of ``labels`` were freed: each is replaced by a :class:`ReleasedArray` that refuses
        every use (an array keeps its memory alive on a GPU: a response kept after its release must not)."""
        arrays, stand_ins = self._arrays, self._stand_ins
        if labels is arrays and self.released is None and stand_ins is not None:  # all at once: the usual release
            self.released = {*stand_ins}
            arrays.update(stand_ins)
            self._buffers.clear()
            if self.views is not None:  # walked: what its chunks hold goes too
                self._drop_views()
            if self.spill is not None:  # host copies of spilled arrays go with them
                self.spill.released(stand_ins)
            return
        labels = [*labels]  # a copy: the arrays are replaced below
        if self.released is None:
            self.released = {*labels}  # a display, not set(): this runs on every release
        else:
            self.released.update(labels)
        buffers = self._buffers
        for label in labels:
            if label in arrays:
                array = arrays[label]  # a hand-built response may hold anything: what it says of itself
                arrays[label] = ReleasedArray(label, getattr(array, "shape", ()), getattr(array, "dtype", None))
            buffers.pop(label, None)
        self._drop_views()
        if self.spill is not None:  # host copies of spilled arrays go with them
            self.spill.released(labels)

    def use(self) -> AbstractAsyncContextManager[dict[str, Any]]:
        """The arrays, resident (spilled ones restored) and kept from spilling until the block exits."""
        return _as_they_are(self._arrays) if self.spill is None else self.spill.use()

    def swap(self, label: str, arrays: list[Any]) -> None:
        """``label``'s arrays (its chunk buffers, in order) are ``arrays`` now: spilled stand-ins or restored arrays."""
        self._arrays[label] = arrays[0]
        if len(arrays) > 1:
            self._buffers[label] = tuple(arrays)
        self._drop_views()

    def _drop_views(self) -> None:
        """Forget the views walks reuse; what chunks handed out hold (``views["arrays"]``, a one-chunk walk's
        ``chunk.device``; ``views["chunk"]``, the last rotated chunk's) now holds the arrays as they are: a
        released or spilled one's stand-in. A chunk kept after its walk (a loop variable outlives its loop)
        must not keep freed memory alive: on a GPU an array holds its block, and a ``memory_limit`` counts it."""
        views, self.views = self.views, None
        if views is not None:
            arrays = self._arrays
            for held in (views.get("arrays"), views.get("chunk")):
                if held:
                    for label in held.keys() & arrays.keys():
                        held[label] = arrays[label]

    def cached_views(self) -> dict[str, Any]:
        """What walks work out once and ask again (full shapes, copiers, a device view): made on first use."""
        views = self.views
        if views is None:
            views = self.views = {}
        return views

    def walk_started(self) -> None:
        """A walk over the arrays begins: frees of them wait until it has ended (see :meth:`after_walks`)."""
        self.walks += 1

    def walk_ended(self) -> None:
        """A walk ended, its copies done: once none is under way, run what waited for them, in order."""
        if not self.walks:
            return
        self.walks -= 1
        deferred = self._deferred
        while not self.walks and deferred:
            deferred.pop(0)()

    def after_walks(self, then: Callable[[], None]) -> None:
        """Call ``then`` now, or once the walks under way have ended (the account frees a released
        response's blocks so: a walk's copies queued ahead still use them)."""
        if not self.walks:
            then()
        elif self._deferred is None:
            self._deferred = [then]
        else:
            self._deferred.append(then)


class ReleasedArray:
    """What a released response's ``arrays[label]`` holds: every use raises :class:`ReleasedError`.

    The response lets go of a released array, so its memory goes back even while the response
    is kept (an ``async with mgr.request(...) as response`` variable outlives its block). What
    the array was stays readable, none of its memory: ``shape``, ``dtype``, ``ndim``, ``size``,
    ``nbytes`` (a ready hook may read them after an ordered request was released).
    """

    __slots__ = ("dtype", "label", "shape")

    def __init__(self, label: str, shape: tuple[int, ...] = (), dtype: Any = None) -> None:
        # set once: responses of one request set share their stand-ins (RequestSet.stand_ins)
        setattr_ = object.__setattr__
        setattr_(self, "label", label)
        setattr_(self, "shape", tuple(shape))
        setattr_(self, "dtype", dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize if self.dtype is not None else 0

    def __repr__(self) -> str:
        return f"<released array {self.label!r} {self.shape} {self.dtype}>"

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise self._refusal()

    def _refusal(self) -> Exception:
        return ReleasedError(
            f"array {self.label!r} of this response was released (mgr.release, free, free_all, the end of its "
            "request's `async with`, its manager's exit, or a context reset): its memory may hold another array's data by now. "
            "Use the arrays inside the `async with` block, or request them again"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # copy, pickle and numpy probe dunders: not there
            raise AttributeError(name)
        return self._refuse()

    def __format__(self, spec: str) -> str:  # f"{x}" prints the stand-in; a number's format needs the data
        return repr(self) if not spec else self._refuse()

    def __hash__(self) -> int:  # __eq__ refuses: a stand-in is still a dict key, by identity
        return id(self)

    def __setattr__(self, name: str, value: object) -> None:  # numpy's in-place x.shape = ..., x.dtype = ...
        self._refuse()

    def __reduce__(self) -> tuple[Any, ...]:  # a copy or a pickle is made anew (its attributes are set once)
        return ReleasedArray, (self.label, self.shape, self.dtype)

    __delattr__ = _refuse
    __getitem__ = __setitem__ = __len__ = __iter__ = __array__ = __bool__ = __float__ = __int__ = _refuse
    __index__ = __complex__ = __round__ = __contains__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __divmod__ = __rdivmod__ = __rpow__ = _refuse
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __lshift__ = __rlshift__ = _refuse
    __rshift__ = __rrshift__ = __invert__ = _refuse
    __neg__ = __pos__ = __abs__ = __matmul__ = __rmatmul__ = __pow__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __eq__ = __ne__ = _refuse  # an array compares element by element: a quiet False would mislead
    __iadd__ = __isub__ = __imul__ = __itruediv__ = __ifloordiv__ = __imod__ = __ipow__ = _refuse
    __iand__ = __ior__ = __ixor__ = __ilshift__ = __irshift__ = __imatmul__ = _refuse

    @property
    def __cuda_array_interface__(self) -> Any:
        return self._refuse()


class SpilledArray(ReleasedArray):
    """What ``arrays[label]`` holds while a spillable array is on the host: every use raises
    :class:`SpilledError` (``async with response.use()`` brings the array back)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<spilled array {self.label!r} {self.shape} {self.dtype}>"

    def _refusal(self) -> Exception:
        return SpilledError(
            f"array {self.label!r} of this response is spilled to host memory: use it inside "
            "`async with response.use() as arrays:`, which brings it back to the device (arrays[label] "
            "is the resident array there)"
        )
