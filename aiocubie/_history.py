"""The allocation history: every plan, allocation, release, failure, recovery step and reset, in a ring.

Opt-in (``MemoryManager.record_history``): when off, the hot path pays one ``is not None``
check. Pure: no device and no event loop; the only I/O is the explicit :meth:`History.to_json`
and :meth:`History.load`.
"""

from __future__ import annotations

import enum
import json
import os
import time
import traceback
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import attrs

from ._errors import ConfigurationError, shown
from ._ledger import Allocation
from ._planner import ChunkPlan

__all__ = ["EventKind", "History", "HistoryEvent", "HistoryRecorder"]

#: Events a history keeps by default (the most recent ones).
MAX_ENTRIES = 100_000
#: The version of the JSON layout :meth:`History.to_dict` writes.
FORMAT = 1
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


class EventKind(str, enum.Enum):
    """What a :class:`HistoryEvent` records."""

    PLAN = "plan"  #: a batch's chunk plan, before its arrays are allocated
    ALLOCATE = "allocate"  #: one array handed out
    RELEASE = "release"  #: one array given back
    FAILURE = "failure"  #: a batch failed (planning or allocation)
    RECOVERY = "recovery"  #: an out-of-memory recovery step
    RESET = "reset"  #: peak stats reset, or a context reset (every array gone)


@attrs.frozen
class HistoryEvent:
    """One event of a :class:`History`. Bytes are bytes, times seconds.

    Attributes
    ----------
    kind : EventKind
        What happened.
    time : float
        ``time.monotonic()`` when it happened; add :attr:`History.wall_base` for the wall clock.
    group, instance, label : str or None
        Who it concerned (None where it concerned no one in particular).
    nbytes : int
        VRAM bytes: of the array (allocate, release), of the batch (plan, failure), freed
        (recovery).
    memory_kind : str or None
        ``"device"``, ``"managed"``, ... for allocate and release.
    chunks, chunk_length : int or None
        The batch's chunk plan (plan, allocate).
    group_live, instance_live : int or None
        VRAM bytes the group and the instance hold after the event (allocate, release).
    detail : str
        Words: the plan's runs and requests, the error, the recovery step, what was reset.
    stack : tuple of str or None
        Where it was asked from, innermost last (``record_history(stacks=True)`` only).
    """

    kind: EventKind = attrs.field(converter=EventKind)
    time: float
    group: str | None = None
    instance: str | None = None
    label: str | None = None
    nbytes: int = 0
    memory_kind: str | None = None
    chunks: int | None = None
    chunk_length: int | None = None
    group_live: int | None = None
    instance_live: int | None = None
    detail: str = ""
    stack: tuple[str, ...] | None = attrs.field(default=None, converter=attrs.converters.optional(tuple))


_FIELDS = tuple(field.name for field in attrs.fields(HistoryEvent))


@attrs.frozen
class History:
    """A recorded allocation history (see :meth:`MemoryManager.history`).

    Attributes
    ----------
    events : tuple of HistoryEvent
        Oldest first.
    wall_base : float
        ``time.time() - time.monotonic()`` when recording started: an event's wall-clock
        time is ``wall_base + event.time`` seconds since the epoch.
    max_entries : int
        The ring's size: older events were dropped.
    dropped : int
        Events dropped to keep at most ``max_entries``.
    """

    events: tuple[HistoryEvent, ...]
    wall_base: float
    max_entries: int = MAX_ENTRIES
    dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable values: bytes in bytes, times in seconds (``time`` monotonic)."""
        return {
            "format": FORMAT,
            "wall_base": self.wall_base,
            "max_entries": self.max_entries,
            "dropped": self.dropped,
            "events": [
                {name: (value.value if isinstance(value, EventKind) else value) for name, value in zip(_FIELDS, row)}
                for row in (attrs.astuple(event, recurse=False) for event in self.events)
            ],
        }

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` to ``path`` as JSON."""
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.to_dict(), file)

    @classmethod
    def from_dict(cls, data: Any) -> History:
        """The history :meth:`to_dict` gave.

        Raises
        ------
        ConfigurationError
            If ``data`` is not such a mapping (naming what is wrong).
        """
        try:
            if data.get("format") != FORMAT:
                raise ConfigurationError(
                    f"not an aiocubie history of format {FORMAT} (format {shown(data.get('format'))}): "
                    "write it with mgr.history().to_json(path)"
                )
            events = tuple(HistoryEvent(**event) for event in data["events"])
            return cls(events, float(data["wall_base"]), int(data["max_entries"]), int(data["dropped"]))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"not an aiocubie history: {exc!r}; write one with mgr.history().to_json(path)")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> History:
        """Read a history :meth:`to_json` wrote.

        Raises
        ------
        ConfigurationError
            If the file is not JSON or not a history.
        """
        try:
            with open(path, encoding="utf-8") as file:
                data = json.load(file)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{os.fspath(path)!r} is not JSON ({exc}): pass a file History.to_json wrote")
        except OSError as exc:
            raise ConfigurationError(f"cannot read the history {os.fspath(path)!r}: {exc.strerror or exc}") from exc
        return cls.from_dict(data)

    def series(self, by: str = "group") -> dict[str, tuple[list[float], list[int]]]:
        """Live VRAM bytes over time of each group (``by="group"``) or instance (``"instance"``).

        Returns name -> (times in seconds since the first event, bytes held after each
        change). A context reset brings every series to zero.
        """
        if by not in ("group", "instance"):
            raise ConfigurationError(f"series by {shown(by)}: use 'group' or 'instance'")
        live_field = f"{by}_live"
        start = self.events[0].time if self.events else 0.0
        out: dict[str, tuple[list[float], list[int]]] = {}
        for event in self.events:
            t = event.time - start
            if event.kind is EventKind.RESET and event.detail.startswith("context"):
                for times, values in out.values():
                    times.append(t)
                    values.append(0)
                continue
            name, live = getattr(event, by), getattr(event, live_field)
            if name is None or live is None:
                continue
            times, values = out.setdefault(name, ([], []))
            times.append(t)
            values.append(live)
        return out


class HistoryRecorder:
    """Keeps history events in a bounded ring as plain tuples (cheap), made into a :class:`History` on demand.

    Parameters
    ----------
    max_entries : int
        The ring's size (the most recent events are kept).
    stacks : bool
        Record where each plan and allocation was asked from (``traceback.extract_stack``).
    names : callable
        Instance key -> name.
    groups, instances : dict
        What each group and instance (by name) holds now: the running totals start there.
    dump_on_oom : str, optional
        Write the history there when an allocation fails after every recovery step.
    """

    def __init__(
        self,
        max_entries: int = MAX_ENTRIES,
        *,
        stacks: bool = False,
        names: Callable[[Hashable], str] = str,
        groups: dict[str, int] | None = None,
        instances: dict[str, int] | None = None,
        dump_on_oom: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigurationError(f"max_entries must be an int >= 1, got {shown(max_entries)}")
        self.max_entries = max_entries
        self.stacks = bool(stacks)
        self.dump_on_oom = dump_on_oom
        self.wall_base = time.time() - time.monotonic()
        self.recorded = 0
        self._events: deque[tuple[Any, ...]] = deque(maxlen=max_entries)
        self._names = names
        self._seen: dict[Hashable, str] = {}  # key -> name while it holds arrays (a name outlives its member)
        self._groups: dict[str, int] = dict(groups or {})
        self._instances: dict[str, int] = dict(instances or {})

    def __len__(self) -> int:
        return len(self._events)

    def _stack(self) -> tuple[str, ...] | None:
        if not self.stacks:
            return None
        frames = traceback.extract_stack()
        return tuple(f"{f.filename}:{f.lineno} in {f.name}" for f in frames if not f.filename.startswith(_PACKAGE))

    def _add(self, row: tuple[Any, ...]) -> None:
        self.recorded += 1
        self._events.append(row)

    def plan(self, group: str, plan: ChunkPlan, requests: int) -> None:
        """A batch of ``requests`` requests of ``group`` is about to be allocated with ``plan``."""
        detail = f"{requests} request(s), {plan.runs} runs"
        self._add(
            (
                EventKind.PLAN,
                time.monotonic(),
                group,
                None,
                None,
                plan.planned_bytes,
                None,
                plan.chunks,
                plan.chunk_length,
                None,
                None,
                detail,
                self._stack(),
            )
        )

    def allocated(self, allocations: Iterable[Allocation], plan: ChunkPlan) -> None:
        """``allocations`` were handed out with ``plan``."""
        now, stack, groups, instances = time.monotonic(), self._stack(), self._groups, self._instances
        chunks, length = plan.chunks, plan.chunk_length
        seen = self._seen
        for a in allocations:
            instance = seen.get(a.key)
            if instance is None:
                instance = seen[a.key] = self._names(a.key)
            group_live = groups[a.group] = groups.get(a.group, 0) + a.vram
            instance_live = instances[instance] = instances.get(instance, 0) + a.vram
            self._add(
                (
                    EventKind.ALLOCATE,
                    now,
                    a.group,
                    instance,
                    a.label,
                    a.vram,
                    a.kind.value,
                    chunks,
                    length,
                    group_live,
                    instance_live,
                    "",
                    stack,
                )
            )

    def released(self, allocations: Iterable[Allocation]) -> None:
        """``allocations`` were given back."""
        now, groups, instances = time.monotonic(), self._groups, self._instances
        seen = self._seen
        for a in allocations:
            instance = seen.get(a.key)
            if instance is None:
                instance = self._names(a.key)
            group_live = groups[a.group] = groups.get(a.group, 0) - a.vram
            instance_live = instances[instance] = instances.get(instance, 0) - a.vram
            if not instance_live:
                seen.pop(a.key, None)
            self._add(
                (
                    EventKind.RELEASE,
                    now,
                    a.group,
                    instance,
                    a.label,
                    a.vram,
                    a.kind.value,
                    None,
                    None,
                    group_live,
                    instance_live,
                    "",
                    None,
                )
            )

    def regrouped(self, instance: str, old: str, new: str, nbytes: int) -> None:
        """What ``instance`` holds (``nbytes``) counts in group ``new`` from now on."""
        self._groups[old] = self._groups.get(old, 0) - nbytes
        self._groups[new] = self._groups.get(new, 0) + nbytes

    def failure(self, group: str, nbytes: int, error: BaseException) -> None:
        """A batch of ``group`` needing ``nbytes`` failed with ``error``."""
        self._note(EventKind.FAILURE, group, nbytes, f"{type(error).__name__}: {error}")

    def recovery(self, group: str, nbytes: int, detail: str) -> None:
        """An out-of-memory recovery step for ``group`` freed ``nbytes`` (``detail`` says which)."""
        self._note(EventKind.RECOVERY, group, nbytes, detail)

    def reset(self, detail: str, *, context: bool = False) -> None:
        """Peak stats were reset (``detail`` says which), or (``context``) every array is gone."""
        if context:
            self._groups = dict.fromkeys(self._groups, 0)
            self._instances = dict.fromkeys(self._instances, 0)
            self._seen.clear()
            detail = f"context: {detail}"
        self._note(EventKind.RESET, None, 0, detail)

    def _note(self, kind: EventKind, group: str | None, nbytes: int, detail: str) -> None:
        self._add((kind, time.monotonic(), group, None, None, nbytes, None, None, None, None, None, detail, None))

    def history(self) -> History:
        """The events so far, as a :class:`History`."""
        events = tuple(HistoryEvent(*row) for row in self._events)
        return History(events, self.wall_base, self.max_entries, self.recorded - len(events))
