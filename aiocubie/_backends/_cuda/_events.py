"""CUDA events on cuda.core, and their completion callbacks: one waiting thread per stream.

The waiting thread (:class:`~aiocubie._backends._waiter.StreamWaiter`) sleeps in a blocking-sync
``Event.sync()`` (the driver wakes it; cuda.core releases the GIL), so nothing spins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuda.core import Event as CoreEvent
from cuda.core import EventOptions

from .._device import Event
from .._waiter import StreamWaiter
from ._errors import map_exceptions, translate

__all__ = ["EVENT_OPTIONS", "CudaEvent"]

#: Blocking sync makes a waiting thread sleep in the kernel rather than spin a core; no timing
#: makes recording cheaper.
EVENT_OPTIONS = EventOptions(blocking_sync=True, timing_enabled=False)


class CudaEvent(Event):
    """A blocking-sync cuda.core ``Event`` recorded on a stream.

    Parameters
    ----------
    event : cuda.core.Event
        The recorded event; handed back to ``spares`` when this object is collected, to be
        recorded again (creating an event costs about three times a re-record).
    stream : cuda.core.Stream
        The stream it was recorded on.
    waiter : callable
        ``waiter(stream)`` gives the :class:`StreamWaiter` of ``stream``.
    spares : list
        Where the event goes back when this object is collected.
    """

    __slots__ = ("_spares", "_waiter", "event", "stream")

    pollable = True  # the GPU completes it; cuEventQuery costs about a microsecond

    def __init__(
        self, event: CoreEvent, stream: Any, waiter: Callable[[Any], StreamWaiter], spares: list[CoreEvent]
    ) -> None:
        self.event = event
        self.stream = stream
        self._waiter = waiter
        self._spares = spares

    def __del__(self) -> None:
        # Whoever still waits on the event (a StreamWaiter) holds this object, not just the event.
        self._spares.append(self.event)

    def __cuda_event__(self) -> Any:
        """The cuda.core event, for code that wants to wait on it itself."""
        return self.event

    def query(self) -> bool:
        try:
            return bool(self.event.is_done)
        except Exception as exc:
            mapped = translate(exc, "querying an event")
            if mapped is None:
                raise
            raise mapped from exc

    def synchronize(self) -> None:
        with map_exceptions("waiting for an event"):
            self.event.sync()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the GPU reaches the event: now if it has, else from the stream's waiting thread."""
        if self.query():
            callback()
        else:
            # the waiter holds self (not only the event), so the event is not recycled meanwhile
            event = self.event
            self._waiter(self.stream).submit(event, _Hold(self, callback))


class _Hold:
    """A callback that keeps its :class:`CudaEvent` alive (so its event is not re-recorded) until it runs."""

    __slots__ = ("callback", "owner")

    def __init__(self, owner: CudaEvent, callback: Callable[[], None]) -> None:
        self.owner = owner
        self.callback = callback

    def __call__(self) -> None:
        callback = self.callback
        self.owner = self.callback = None  # type: ignore[assignment]
        callback()
