"""The lifecycle of a manager: entering ``async with``, closing when it ends, and closing for good.

Handed the backend (closed here only if the manager made it), the serving holder, the registry,
the registration, the stream groups and a way to free every array, it starts and stops serving in order and
says why a request cannot be served now. It serves nothing itself and never reaches the manager.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ._backends import Backend
from ._completion import Loop
from ._errors import ManagerStateError
from ._groups import StreamGroups
from ._protocols import StreamLike
from ._registry import Members, Registry
from ._serving import Serving

__all__ = ["Lifecycle"]

_CLOSED = "the memory manager was closed with close(): make a new MemoryManager"


class Lifecycle:
    """Whether a manager serves, has served or is closed for good, and the moves between.

    Parameters
    ----------
    backend : Backend
        Closed when serving ends (and on :meth:`close`) if ``owns_backend``.
    owns_backend : bool
        The manager made the backend (and so closes it, and makes new streams to serve again).
    serving : Serving
        The loop and task group; entered and exited here.
    registry : Registry
        Told whom to call when an instance is collected; its streams renewed to serve again.
    registration : Members
        Reaps collected instances.
    groups : StreamGroups
        Started on entering; closed on leaving.
    free_all : callable
        Frees every array on leaving.
    """

    def __init__(
        self,
        backend: Backend,
        owns_backend: bool,
        serving: Serving,
        registry: Registry,
        registration: Members,
        groups: StreamGroups,
        free_all: Callable[[], None],
    ) -> None:
        self._backend = backend
        self._owns_backend = owns_backend
        self._serving = serving
        self._registry = registry
        self._registration = registration
        self._groups = groups
        self._free_all = free_all
        self._closed = False  # close() was called: never runs again
        self._backend_closed = False  # our own backend was closed when the last `async with` ended
        self._exited = False  # served, and its `async with` ended

    async def enter(self) -> None:
        """Start serving in the calling task (see ``MemoryManager.__aenter__``).

        Raises
        ------
        ManagerStateError
            If the manager was closed, or serves already.
        """
        if self._closed:
            raise ManagerStateError(_CLOSED)
        serving = self._serving
        if serving.task_group is not None:
            raise ManagerStateError("this manager is already running (or its `async with` has not ended yet)")
        if self._backend_closed:  # the backend we made was closed at the last exit: new streams
            self._registry.renew_streams()
            self._backend_closed = False
        loop = await serving.enter()
        # a collected member is reaped on the loop thread at once, not at the next manager call
        registration = self._registration
        self._registry.on_collected = partial(loop.call_soon_threadsafe_or_drop, registration.reap_collected)
        registration.reap()
        self._groups.start()
        self._exited = False

    async def aclose(self) -> None:
        """Stop serving (see ``MemoryManager.aclose``).

        Raises
        ------
        ManagerStateError
            From another thread than the loop's (nothing changes).
        """
        loop = self._serving.loop
        if loop is not None:
            foreign = loop.foreign()
            if foreign is not None:
                raise ManagerStateError(f"aclose() from another thread: {foreign}")
            self._shut_down()
            self._exited = True
        await self._serving.exit()

    def _shut_down(self) -> None:
        """Fail every open request, free every array, stop every scheduler (sync: no await)."""
        self._serving.loop = None
        self._registry.on_collected = None
        self._groups.close(
            ManagerStateError(
                "the memory manager was closed (it exited: the end of its `async with`, or aclose()) before "
                "the request was served"
            )
        )
        self._free_all()
        if self._owns_backend:
            self._backend.close()
            self._backend_closed = True

    def close(self) -> None:
        """Close for good (see ``MemoryManager.close``).

        Raises
        ------
        ManagerStateError
            While the manager serves.
        """
        if self._serving.task_group is not None:
            raise ManagerStateError("close() on a running manager: leave its `async with` first")
        self._closed = True
        self._free_all()
        if self._owns_backend:
            self._backend.close()

    def check_closed(self) -> None:
        """Refuse to make streams once close() closed the backend the manager made, for good.

        Raises
        ------
        ManagerStateError
            After close().
        """
        if self._closed and self._owns_backend:
            raise ManagerStateError(_CLOSED)

    def check_streams(self) -> None:
        """Refuse work on the streams once the backend the manager made was closed with them (at its
        exit, or close()): say so, and what to do.

        Raises
        ------
        ManagerStateError
            After the exit (until the manager is entered again), or after close().
        """
        self.check_closed()
        if self._backend_closed:
            raise ManagerStateError(
                "the memory manager exited (the end of its `async with`, or aclose()) and closed the backend "
                "it made, its streams with it: allocate, copy and wait inside `async with mgr:` (entering it "
                "again gives new streams)"
            )

    def stream_of(self, instance: object) -> StreamLike:
        """The stream of ``instance``'s group, while it is open (see :meth:`check_streams`)."""
        self.check_streams()
        return self._registration.stream_of(instance)

    def refusal(self, loop: Loop | None) -> ManagerStateError:
        """Why a request awaited now cannot be served (``loop``: the serving loop, or None)."""
        if self._closed:
            return ManagerStateError(_CLOSED)
        if loop is None and self._exited:
            return ManagerStateError(
                "the memory manager is not running: it exited (the end of its `async with`, or aclose()); "
                "make requests inside `async with mgr:` (a manager can be entered again)"
            )
        if loop is None:
            return ManagerStateError("the memory manager is not running: use `async with MemoryManager() as mgr:`")
        return ManagerStateError(f"a request awaited from another thread: {loop.foreign()}")
