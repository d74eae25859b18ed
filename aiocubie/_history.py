"""The allocation history: every plan, allocation, release, failure, recovery step and reset, in a ring;
and each request's way (queued, ready), each batch's waits and each walk's chunks.

Opt-in (``MemoryManager.record_history``): when off, the hot path pays one ``is not None``
check. Pure: no device and no event loop; the only I/O is the explicit :meth:`History.to_json`,
:meth:`History.load` and the exports (:meth:`History.to_perfetto`, :meth:`History.to_memory_viz`).
"""

from __future__ import annotations

import array
import enum
import json
import logging
import math
import os
import time
import traceback
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from . import _memory_viz, _trace
from ._errors import ConfigurationError, shown
from ._ledger import Allocation, Ledger
from ._planner import ChunkPlan
from ._protocols import Queued
from ._stats import Snapshot

__all__ = ["EventKind", "History", "HistoryEvent", "HistoryRecorder"]

log = logging.getLogger("aiocubie")

#: Events a history keeps by default (the most recent ones).
MAX_ENTRIES = 100_000
#: The most entries a recorder keeps (about 1 GiB of ring).
MAX_RING = 10_000_000
#: Values a row of the recorder's ring holds (an allocation's: the widest).
_WIDTH = 11
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
    REGROUP = "regroup"  #: an instance moved to another stream group with what it holds (one event per group)
    SPILL = "spill"  #: one spillable array copied to host, its device memory given back
    RESTORE = "restore"  #: a response's spilled arrays back on the device (their allocations are recorded too)
    QUEUED = "queued"  #: a request's batch was allocated: its wait in the queue, from ``since``, ended
    READY = "ready"  #: the device reached a request's batch's event (an ordered request: at its allocation)
    WAIT = "wait"  #: a batch waited from ``since`` (``detail`` says for what), or made way for a higher priority
    WALK = "walk"  #: a step of a walk's ``chunk``; ``label``: ``"copy in"``, ``"body"``, ``"copy out"``, ``"landed"``;
    #: ``detail``: the response walked (its ``id``: walks of one instance at once are told apart)


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
    priority : int or None
        The request's or the batch's priority (queued, ready, wait).
    since : float or None
        ``time.monotonic()`` when what the event ends began: the request was asked (queued), the
        batch began to wait (wait).
    chunk : int or None
        The chunk of a walk (walk).
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
    priority: int | None = None
    since: float | None = None
    chunk: int | None = None


_FIELDS = tuple(field.name for field in attrs.fields(HistoryEvent))
_NAMES = ("group", "instance", "label", "memory_kind")
_COUNTS = ("chunks", "chunk_length", "group_live", "instance_live", "priority", "chunk")


def _wrong_fields(event: HistoryEvent) -> list[str]:
    """``name=value`` of each field of a loaded event of the wrong type (refused: ``series`` would fail later)."""

    def number(value: Any, optional: bool, real: bool = False) -> bool:
        if value is None:
            return optional
        return not isinstance(value, bool) and isinstance(value, (int, float) if real else int)

    return [
        f"{name}={shown(getattr(event, name))}"
        for name, ok in (
            ("time", number(event.time, False, real=True) and math.isfinite(event.time)),
            ("nbytes", number(event.nbytes, False)),
            ("since", number(event.since, True, real=True) and math.isfinite(event.since or 0.0)),
            *((name, number(getattr(event, name), True)) for name in _COUNTS),
            *((name, getattr(event, name) is None or isinstance(getattr(event, name), str)) for name in _NAMES),
            ("detail", isinstance(event.detail, str)),
        )
        if not ok
    ]


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

    def to_perfetto(self, path: str | os.PathLike[str], snapshots: Sequence[Snapshot] = ()) -> Path:
        """Write the history as a trace in the Trace Event format: open it in ui.perfetto.dev or chrome://tracing.

        Tracks: a track per stream group with its batches (from the plan to the release of the
        batch's last array; inside, the allocation), a track per instance with its requests
        (planned, allocated, released; inside, each array from its allocation to its release),
        marks for failures, recovery steps, moves and resets, and "live bytes" counters per group
        and per instance. A track whose spans overlap is drawn in lanes (``loader (2)``).

        Parameters
        ----------
        path : str or path
            The JSON file to write.
        snapshots : sequence of Snapshot
            A :class:`~aiocubie.stats.Recorder`'s snapshots (``recorder.snapshots``) of the same run:
            adds counters of the device's free bytes, the allocator pool's bytes held and in use, and
            other libraries' bytes in the pool.

        Returns
        -------
        Path
            The file written.

        Raises
        ------
        ConfigurationError
            If ``path`` is not a path or cannot be written, or ``snapshots`` holds something else.
        """
        trace = _trace.trace_events(self.events, snapshots, wall_base=self.wall_base, dropped=self.dropped)
        return _trace.write(trace, path)

    def to_memory_viz(self, path: str | os.PathLike[str]) -> Path:
        """Write the history's allocations as a memory snapshot that pytorch.org/memory_viz opens.

        A pickle in the format ``torch.cuda.memory._dump_snapshot`` writes (torch's viewer reads
        nothing else): each stream group a segment of made-up addresses (the history records sizes,
        not addresses), each array an allocation named ``instance: label`` in its group. Open only
        pickles you trust: unpickling runs code.

        Returns
        -------
        Path
            The file written.

        Raises
        ------
        ConfigurationError
            If ``path`` is not a path or cannot be written.
        """
        return _memory_viz.write(self.events, path)

    @classmethod
    def from_dict(cls, data: Any) -> History:
        """The history :meth:`to_dict` gave.

        Raises
        ------
        ConfigurationError
            If ``data`` is not such a mapping (naming what is wrong).
        """
        return cls._read(data, "the data")

    @classmethod
    def _read(cls, data: Any, source: str) -> History:
        """The history in ``data``, read from ``source`` (named in the errors)."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            found = f"format {shown(data.get('format'))}" if isinstance(data, Mapping) else f"a {type(data).__name__}"
            raise ConfigurationError(
                f"{source} is not an aiocubie history of format {FORMAT} ({found}): write one with "
                "mgr.history().to_json(path)"
            )
        try:
            events = tuple(HistoryEvent(**event) for event in data["events"])
            for index, event in enumerate(events):
                wrong = _wrong_fields(event)
                if wrong:
                    raise ConfigurationError(
                        f"{source} is not an aiocubie history: event {index} ({event.kind.value!r}) has fields "
                        f"of the wrong type: {', '.join(wrong)} (times are finite numbers of seconds, byte "
                        "counts integers, names strings)"
                    )
            return cls(events, float(data["wall_base"]), int(data["max_entries"]), int(data["dropped"]))
        except ConfigurationError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"{source} is not an aiocubie history ({type(exc).__name__}: {exc}): write one with "
                "mgr.history().to_json(path)"
            ) from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> History:
        """Read a history :meth:`to_json` wrote.

        Raises
        ------
        ConfigurationError
            If ``path`` is not a path, or the file is not JSON or not a history (naming the file,
            and the event and value that are wrong).
        """
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigurationError(f"History.load reads a file: pass its path, got {shown(path)}")
        try:
            with open(path, encoding="utf-8") as file:
                data = json.load(file)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(
                f"{os.fspath(path)!r} is not JSON ({exc}): pass a file History.to_json wrote"
            ) from exc
        except OSError as exc:
            raise ConfigurationError(f"cannot read the history {os.fspath(path)!r}: {exc.strerror or exc}") from exc
        return cls._read(data, repr(os.fspath(path)))

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
    """Keeps history events in a bounded ring of plain values (cheap), made into a :class:`History` on demand.

    A row holds references to what the caller has already (names, sizes, the plan's numbers)
    and one timestamp; what each group and instance holds after an event is worked out when
    :meth:`history` is called, walking back from what the ledger holds then.

    Parameters
    ----------
    max_entries : int
        The ring's size (the most recent events are kept).
    ledger : Ledger
        The ledger the events are about. The recorder is told of every change to it:
        allocations, releases, regroupings and context resets.
    names : callable
        Instance key -> name (of a registered instance).
    stacks : bool
        Record where each plan and allocation was asked from (``traceback.extract_stack``).
    dump_on_oom : str, optional
        Write the history there when an allocation fails after every recovery step.
    """

    def __init__(
        self,
        max_entries: int = MAX_ENTRIES,
        *,
        ledger: Ledger,
        names: Callable[[Hashable], str],
        stacks: bool = False,
        dump_on_oom: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or not 1 <= max_entries <= MAX_RING:
            raise ConfigurationError(
                f"max_entries must be an int from 1 to {MAX_RING:,} (the ring is allocated up front, "
                f"about {8 * _WIDTH + 8} bytes an entry), got {shown(max_entries)}"
            )
        if dump_on_oom is not None and not isinstance(dump_on_oom, (str, os.PathLike)):
            # open() would take an int as a file descriptor, and close it after writing
            raise ConfigurationError(f"dump_on_oom must be a file path or None, got {shown(dump_on_oom)}")
        self.max_entries = max_entries
        self.stacks = bool(stacks)
        self.dump_on_oom = dump_on_oom
        self.wall_base = time.time() - time.monotonic()
        self.recorded = 0  # rows written so far: the ring holds the last max_entries of them
        # Rows are written in place into one flat list, _WIDTH slots a row (time apart, as C doubles):
        # they refer only to strings and numbers the caller holds already, so no object an event makes
        # outlives its call. (A ring of tuples kept the collector's young generation full, and a float
        # per row grew the heap until the ring was full: 1.4-1.7x per request on Python 3.12.)
        self._flat: list[Any] = [None] * (max_entries * _WIDTH)
        self._times = array.array("d", bytes(8 * max_entries))
        # perf_counter (a ticket's and a wait's start) -> monotonic: both are monotonic, their offset fixed
        self._perf_offset = time.monotonic() - time.perf_counter()
        self._ledger = ledger
        self._names = names

    def __len__(self) -> int:
        return min(self.recorded, self.max_entries)

    def _stack(self) -> tuple[str, ...]:
        frames = traceback.extract_stack()
        return tuple(f"{f.filename}:{f.lineno} in {f.name}" for f in frames if not f.filename.startswith(_PACKAGE))

    def _put(self, row: tuple[Any, ...]) -> None:
        index = self.recorded % self.max_entries
        self._times[index] = time.monotonic()
        self._flat[index * _WIDTH : index * _WIDTH + len(row)] = row
        self.recorded += 1

    # One row layout per kind (at most _WIDTH values; the time slot stays None), decoded by history().
    def plan(self, group: str, plan: ChunkPlan, requests: int) -> None:
        """A batch of ``requests`` requests of ``group`` is about to be allocated with ``plan``."""
        stack = self._stack() if self.stacks else None
        chunks, length, runs, planned = plan.chunks, plan.chunk_length, plan.runs, plan.planned_bytes
        self._put(("plan", None, group, chunks, length, requests, stack, runs, planned))

    def allocated(self, batch: Sequence[Sequence[Allocation]], plan: ChunkPlan | None) -> None:
        """A batch was handed out with ``plan``: the allocations of each response (one key, one group each).

        ``plan`` None: bytes another library holds for an instance, counted as its own (torch's).
        """
        # never the Allocation itself: it holds the array, and its group changes when it moves
        now, stack = time.monotonic(), self._stack() if self.stacks else None
        chunks, length = (None, None) if plan is None else (plan.chunks, plan.chunk_length)
        flat, times, size, row = self._flat, self._times, self.max_entries, self.recorded
        for allocations in batch:
            if not allocations:
                continue
            name = self._names(allocations[0].key)
            for a in allocations:
                index = row % size
                times[index] = now
                at = index * _WIDTH
                flat[at : at + _WIDTH] = (
                    "allocate", None, a.group, a.key, a.label, a.vram, a.kind._value_, name, chunks, length, stack
                )  # fmt: skip
                row += 1
        self.recorded = row

    def released(self, allocations: Sequence[Allocation], kind: str = "release") -> None:
        """``allocations`` were given back (and are out of the ledger); ``kind`` ``"spill"``: to host."""
        now, flat, times, size, row = time.monotonic(), self._flat, self._times, self.max_entries, self.recorded
        for a in allocations:
            index = row % size
            times[index] = now
            at = index * _WIDTH
            flat[at : at + 7] = (kind, None, a.group, a.key, a.label, a.vram, a.kind._value_)
            row += 1
        self.recorded = row

    def regrouped(self, key: Hashable, old: str, new: str, nbytes: int) -> None:
        """What instance ``key`` holds (``nbytes``) counts in group ``new`` from now on."""
        self._put(("regroup", None, key, old, new, nbytes))

    def failure(self, group: str, nbytes: int, error: BaseException) -> None:
        """A batch of ``group`` needing ``nbytes`` failed with ``error``."""
        self._put(("failure", None, group, nbytes, f"{type(error).__name__}: {error}", None))

    def restored(self, group: str, nbytes: int, detail: str) -> None:
        """Spilled arrays of ``group`` (``nbytes``) are back on the device (``detail`` says whose)."""
        self._put(("restore", None, group, nbytes, detail, None))

    def recovery(self, group: str, nbytes: int, detail: str) -> None:
        """An out-of-memory recovery step for ``group`` freed ``nbytes`` (``detail`` says which)."""
        self._put(("recovery", None, group, nbytes, detail, None))

    def reset(self, detail: str, *, context: bool = False) -> None:
        """Peak stats were reset (``detail`` says which), or (``context``) every array is about to be forgotten.

        A context reset is recorded before the ledger forgets: the row keeps what was held.
        """
        held = None
        if context:
            held = (dict(self._ledger.live_by_group), dict(self._ledger.live_by_key))
            detail = f"context: {detail}"
        self._put(("reset", None, None, 0, detail, held))

    # A request's way and a batch's waits (a scheduler's), and a walk's steps: called only while recording.
    # Rows hold the member's key and perf_counter times as given: names and clocks are read in history().
    def queued(self, group: str, tickets: Sequence[Queued]) -> None:
        """``tickets`` of ``group`` were allocated: their wait in the queue ended (ordered ones are ready)."""
        for ticket in tickets:  # an ordered one is ready too: one row for both
            self._put(("queued", None, group, ticket.key, ticket.enqueued, ticket.priority, ticket.ordered, None))

    def ready(self, group: str, tickets: Sequence[Queued]) -> None:
        """The device reached the event of ``tickets``' batch in ``group``."""
        for ticket in tickets:
            if not ticket.ordered:  # ready when allocated (see queued)
                self._put(("ready", None, group, ticket.key, None, ticket.priority, None, None))

    def express(self, group: str, key: int, priority: int, start: float) -> None:
        """A request of ``key`` asked at ``start`` (``perf_counter``) was allocated and ready at once."""
        self._put(("queued", None, group, key, start, priority, True, None))  # and ready: one row for both

    def waited(self, group: str, reason: str, start: float, priority: int, requests: int) -> None:
        """A batch of ``requests`` requests of ``group`` waited since ``start`` (``perf_counter``) for ``reason``."""
        self._put(("wait", None, group, None, start, priority, f"{reason} ({requests} request(s))", None))

    def walked(self, response: object, step: str, index: int) -> None:
        """A walk over ``response`` reached ``step`` of chunk ``index`` (a released one's steps are left out).

        ``step``: ``"copy in"`` (its inputs' copies are queued), ``"body"`` (the chunk is handed to
        the loop's body), ``"copy out"`` (the body returned: its outputs' copies are queued),
        ``"landed"`` (its outputs are in their host arrays).
        """
        held = self._ledger.of(response)
        if held:
            self._put(("walk", None, held[0].group, held[0].key, None, None, step, index, id(response)))

    def dump(self) -> None:
        """Write the history where ``dump_on_oom`` asks (an error writing it is logged, not raised)."""
        if self.dump_on_oom is None:
            return
        try:
            self.history().to_json(self.dump_on_oom)
        except OSError as exc:  # the out-of-memory error is what the request must see
            log.error("could not write the allocation history to %s: %s", self.dump_on_oom, exc)
        else:
            log.error("allocation history written to %s", self.dump_on_oom)

    def history(self) -> History:
        """The events so far, as a :class:`History`.

        A release is named after the instance that allocated it; if that allocation has left
        the ring, after the instance registered under its key now.
        """
        rows = self._rows()
        owners = _owners(rows)
        # What each group and key holds after each row, walking back from what the ledger holds now.
        groups, keys = dict(self._ledger.live_by_group), dict(self._ledger.live_by_key)
        events: list[HistoryEvent] = []
        for row, owner in zip(reversed(rows), reversed(owners)):
            kind = row[0]
            if kind in ("allocate", "release", "spill"):
                events.append(self._holding(row, owner, groups, keys))
            elif kind == "plan":
                events.append(_planned(row))
            elif kind == "regroup":
                events.extend(self._moved(row, owner, groups))
            elif kind in _WAYS:
                _, at, group, key, since, priority, label, chunk = row[:8]
                name = None if key is None else owner or self._names(key)
                since = None if since is None else since + self._perf_offset
                if kind == "queued" and label:  # ready when allocated (walking back: before its queued event)
                    events.append(HistoryEvent("ready", at, group, name, priority=priority))
                detail = label if kind == "wait" else f"response {row[8]:#x}" if kind == "walk" else ""
                label = label if kind == "walk" else None
                events.append(HistoryEvent(kind, at, group, name, label, detail=detail, priority=priority,
                                           since=since, chunk=chunk))  # fmt: skip
            else:
                _, at, group, nbytes, detail, held = row[:6]
                if held is not None:  # a context reset: before it, this was held
                    groups, keys = dict(held[0]), dict(held[1])
                events.append(HistoryEvent(kind, at, group, nbytes=nbytes, detail=detail))
        events.reverse()
        return History(tuple(events), self.wall_base, self.max_entries, self.recorded - len(rows))

    def _rows(self) -> list[tuple[Any, ...]]:
        """The ring's rows, oldest first: (kind, time, *fields)."""
        flat, times, size = self._flat, self._times, self.max_entries
        rows: list[tuple[Any, ...]] = []
        for written in range(self.recorded - len(self), self.recorded):
            index = written % size
            rows.append((flat[index * _WIDTH], times[index], *flat[index * _WIDTH + 2 : (index + 1) * _WIDTH]))
        return rows

    def _holding(
        self, row: tuple[Any, ...], owner: str | None, groups: dict[str, int], keys: dict[Hashable, int]
    ) -> HistoryEvent:
        """An allocation's or a release's event; ``groups`` and ``keys`` become what was held before it."""
        kind, at, group, key, label, vram, memory = row[:7]
        group_live, key_live = groups.get(group, 0), keys.get(key, 0)
        change = -vram if kind == "allocate" else vram
        groups[group], keys[key] = group_live + change, key_live + change
        if kind == "allocate":
            name, chunks, chunk_length, stack = row[7:11]
            return HistoryEvent(
                kind, at, group, name, label, vram, memory, chunks, chunk_length, group_live, key_live, "", stack
            )
        name = owner or self._names(key)
        return HistoryEvent(kind, at, group, name, label, vram, memory, None, None, group_live, key_live)

    def _moved(self, row: tuple[Any, ...], owner: str | None, groups: dict[str, int]) -> list[HistoryEvent]:
        """A member's move: an event in each group; ``groups`` becomes what was held before it."""
        _, at, key, old, new, nbytes = row[:6]
        name = owner or self._names(key)
        events = [
            HistoryEvent(
                "regroup",
                at,
                group,
                name,
                nbytes=nbytes,
                group_live=groups.get(group, 0),
                detail=f"moved {verb} {other}",
            )
            for group, other, verb in ((new, old, "from"), (old, new, "to"))
        ]
        groups[old], groups[new] = groups.get(old, 0) + nbytes, groups.get(new, 0) - nbytes
        return events


#: The kinds of a request's way, a batch's waits and a walk's steps (rows: group, the member's key, since as
#: perf_counter, priority, the wait's reason, the walk's step or whether a queued one was ready at once, the
#: walk's chunk).
_WAYS = frozenset({"queued", "ready", "wait", "walk"})


def _owners(rows: list[tuple[Any, ...]]) -> list[str | None]:
    """For each row: the name its key had when it allocated (a release or a move takes it), else None."""
    names: dict[Hashable, str] = {}
    owners: list[str | None] = []
    for row in rows:
        if row[0] == "allocate":
            names[row[3]] = row[7]
        key = row[3] if row[0] in ("release", "spill") or row[0] in _WAYS else row[2] if row[0] == "regroup" else None
        owners.append(None if key is None else names.get(key))
    return owners


def _planned(row: tuple[Any, ...]) -> HistoryEvent:
    """A plan's event."""
    _, at, group, chunks, chunk_length, requests, stack, runs, planned = row[:9]
    return HistoryEvent(
        "plan",
        at,
        group,
        nbytes=planned,
        chunks=chunks,
        chunk_length=chunk_length,
        detail=f"{requests} request(s), {runs} runs",
        stack=stack,
    )
