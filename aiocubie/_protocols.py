"""What the pure layer says of a device's handles (a stream, ``__cuda_stream__``, and an event) and of a log.

Typing and abstract classes only, importing nothing of aiocubie's: a response names its stream and
its ready event with them, and the backends implement them (``aiocubie._backends`` re-exports both);
out-of-memory recovery records its steps to a :class:`RecoveryLog` (the history recorder is one); the
exporters of a history read its events as :class:`HistoryRecord`; whether a hook is async.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

__all__ = ["Event", "HistoryRecord", "Queued", "RecoveryLog", "RequestLog", "StreamLike", "is_async_callable"]


def is_async_callable(hook: object) -> bool:
    """True for an ``async def`` function (or partial of one) or an object with ``async def __call__``."""
    return inspect.iscoroutinefunction(hook) or (
        not inspect.isroutine(hook) and inspect.iscoroutinefunction(getattr(hook, "__call__", None))  # noqa: B004 - the method itself, to ask whether it is async
    )


@runtime_checkable
class StreamLike(Protocol):
    """A stream: anything with ``__cuda_stream__`` (cuda.core's ``IsStreamT``), the simulator's too."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


class Event(abc.ABC):
    """A point in a stream: done once all work queued on the stream before it is done.

    Attributes
    ----------
    pollable : bool
        True where the device reaches the event without this process's threads (a GPU) and
        :meth:`query` is cheap: a wait polls it a short while before asking for a callback.
        False for the simulator, whose streams are Python threads that polling would starve
        of the GIL.
    """

    pollable: bool = False

    @abc.abstractmethod
    def query(self) -> bool:
        """True once the event has completed. Never blocks."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the calling thread until the event completes (for worker threads and tests)."""

    @abc.abstractmethod
    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the event completes, from any thread.

        If the event is already complete the callback may run at once, on the calling thread.
        The callback must be quick and must not call into the device library.
        """


class RecoveryLog(Protocol):
    """Where recovery records its steps and its failures (:class:`~aiocubie._history.HistoryRecorder` is one)."""

    def recovery(self, group: str, nbytes: int, detail: str) -> None:
        """A recovery step for ``group`` freed ``nbytes`` (``detail`` says which)."""

    def failure(self, group: str, nbytes: int, error: BaseException) -> None:
        """A batch of ``group`` needing ``nbytes`` failed with ``error``."""

    def dump(self) -> None:
        """Write what was recorded where the user asked for it on a failure (if anywhere)."""


class Queued(Protocol):
    """A request as the history reads it when its batch is allocated or ready (a scheduler's ticket)."""

    @property
    def key(self) -> int:
        """The requesting member's key."""

    @property
    def enqueued(self) -> float:
        """``time.perf_counter()`` when it was asked."""

    @property
    def priority(self) -> int:
        """Its priority."""

    @property
    def ordered(self) -> bool:
        """Ready as soon as its arrays are allocated."""


class RequestLog(RecoveryLog, Protocol):
    """Where a scheduler records its requests' way (queued, ready) and its batches' waits, while a history records.

    :class:`~aiocubie._history.HistoryRecorder` is one. Only called while recording: the request
    path pays one ``is not None`` check where it hands over what it has already.
    """

    def queued(self, group: str, tickets: Sequence[Queued]) -> None:
        """``tickets`` of ``group`` were allocated (their wait in the queue ends; ordered ones are ready)."""

    def ready(self, group: str, tickets: Sequence[Queued]) -> None:
        """The device reached the event of ``tickets``' batch in ``group``."""

    def express(self, group: str, key: int, priority: int, start: float) -> None:
        """A request of ``key`` asked at ``start`` (``perf_counter``) was served and ready at once, with no ticket."""

    def waited(self, group: str, reason: str, start: float, priority: int, requests: int) -> None:
        """A batch of ``requests`` requests of ``group`` waited since ``start`` (``perf_counter``) for ``reason``."""


class HistoryRecord(Protocol):
    """One event of an allocation history as its exporters read it (:class:`~aiocubie.stats.HistoryEvent` is one).

    ``kind`` is one of :class:`~aiocubie.stats.EventKind`'s values (an exporter shows a kind it does
    not know as a mark); times are ``time.monotonic()`` seconds, sizes bytes.
    """

    @property
    def kind(self) -> str: ...
    @property
    def time(self) -> float: ...
    @property
    def group(self) -> str | None: ...
    @property
    def instance(self) -> str | None: ...
    @property
    def label(self) -> str | None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def memory_kind(self) -> str | None: ...
    @property
    def chunks(self) -> int | None: ...
    @property
    def chunk_length(self) -> int | None: ...
    @property
    def group_live(self) -> int | None: ...
    @property
    def instance_live(self) -> int | None: ...
    @property
    def detail(self) -> str: ...
    @property
    def stack(self) -> tuple[str, ...] | None: ...
    @property
    def priority(self) -> int | None: ...
    @property
    def since(self) -> float | None: ...
    @property
    def chunk(self) -> int | None: ...
