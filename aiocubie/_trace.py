"""An allocation history as a trace in the Trace Event format: what Perfetto and chrome://tracing open.

Pure: handed a history's records (and, if given, a :class:`~aiocubie.stats.Recorder`'s snapshots),
it builds the trace's JSON object; the only I/O is :func:`write`. It never touches a manager, a
device or the request path: everything it shows was recorded by the history already.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._errors import ConfigurationError, shown
from ._protocols import HistoryRecord
from ._stats import Snapshot

__all__ = ["SNAPSHOT_COUNTERS", "trace_events", "write"]

#: The trace's processes, each a group of tracks: stream groups, instances, device memory.
GROUPS, INSTANCES, DEVICE = 1, 2, 3
_PROCESSES = {GROUPS: "aiocubie: stream groups", INSTANCES: "aiocubie: instances", DEVICE: "aiocubie: device memory"}

#: Counter tracks read from each snapshot of a Recorder: counter name -> its series (None: unknown,
#: left out). Any other series a snapshot carries: add a line here and it becomes a counter track.
SNAPSHOT_COUNTERS: dict[str, Callable[[Snapshot], Mapping[str, int | None]]] = {
    "device memory": lambda s: {"free": s.free, "held by this manager": s.live_bytes},
    "allocator pool": lambda s: {"held": s.pool.held, "in use": s.pool.in_use},
    "other libraries": lambda s: {"in use": s.other_bytes},
    "spilled to host": lambda s: {"now": s.spill.now},
}


#: Seconds between two looks of one batch's wait drawn as one span (the scheduler looks every 50 ms).
_LOOKS_APART = 0.05


class _Span:
    """A stretch of time on a track, with the spans drawn inside it (``inner``: where its arrays go)."""

    __slots__ = ("args", "children", "end", "inner", "name", "start")

    def __init__(self, start: float, name: str, args: dict[str, Any], end: float | None = None) -> None:
        self.start, self.name, self.args, self.end = start, name, args, end
        self.children: list[_Span] = []
        self.inner = self

    def add(self, start: float, name: str, end: float | None = None) -> _Span:
        """A span inside this one, from ``start``."""
        child = _Span(start, name, {}, end)
        self.children.append(child)
        return child


class _Timeline:
    """The spans and marks of a history: each batch and wait on its group's track, each request
    (queued, planned, allocated: its arrays inside) on its instance's track, each walk's chunks
    (their copies inside) on a track of their own, failures, recoveries, moves and resets as marks."""

    def __init__(self) -> None:
        self.batches: dict[str, list[_Span]] = {}  # group -> its batches (inside: the allocation) and waits
        self.requests: dict[str, list[_Span]] = {}  # instance -> its requests (inside: their arrays)
        self.walks: dict[str, list[_Span]] = {}  # instance -> the chunks its walks copied (inside: the copies)
        self._asked: dict[str, deque[_Span]] = {}  # instance -> requests allocated, their queue wait not yet read
        self._flying: dict[str, deque[_Span]] = {}  # instance -> requests allocated, not yet ready
        self._chunks: dict[tuple[str, str, int], _Span] = {}  # (instance, response, index) -> a chunk under way
        self._waits: dict[str, _Span] = {}  # group -> its last wait (consecutive steps of one wait are one span)
        self.marks: list[tuple[float, int, str, str, dict[str, Any]]] = []  # (time, pid, track, name, args)
        self._served: dict[int, list[_Span]] = {}  # id(batch) -> its requests: a batch ends with the last
        self._planned: dict[str, _Span] = {}  # group -> its last batch, which takes the allocations that follow
        self._held: dict[tuple[str | None, str | None], deque[_Span]] = {}  # (instance, label) -> arrays, oldest first
        self._request: tuple[tuple[float, str | None, str | None], _Span] | None = None
        self.end = 0.0

    def read(self, events: Iterable[HistoryRecord]) -> None:
        """Take ``events``, oldest first."""
        for event in events:
            self.end = event.time
            kind = str(getattr(event.kind, "value", event.kind))
            if kind == "plan":
                self._plan(event)
            elif kind == "allocate":
                self._allocate(event)
            elif kind == "release":
                self._release(event)
            elif kind in ("queued", "ready"):
                self._way(kind, event)
            elif kind == "wait":
                self._wait(event)
            elif kind == "walk":
                self._walk(event)
            else:
                if kind == "reset" and event.detail.startswith("context"):
                    self._forget(event.time)
                self._waits.pop(event.group or "?", None)  # a failure or a reset ends the group's wait
                args = {"detail": event.detail, "bytes": event.nbytes, "instance": event.instance}
                self.marks.append((event.time, GROUPS, f"group {event.group}" if event.group else "", kind, args))
        for held in self._held.values():
            for array in held:
                array.end = self.end
                array.args["held at the end"] = True
        for spans in self.requests.values():
            for request in spans:
                inner = request.inner
                inner.end = max((a.end or inner.start for a in inner.children), default=inner.start)
                request.end = max(inner.end, *(c.end or request.start for c in request.children))
        for spans in self.batches.values():
            for batch in spans:
                if batch.end is None:  # a batch (a wait has its end)
                    ends = [s.end or batch.start for s in (*batch.children, *self._served.get(id(batch), ()))]
                    batch.end = max(ends, default=batch.start)
        for chunk in self._chunks.values():
            _cut(chunk)

    def _plan(self, event: HistoryRecord) -> None:
        group = event.group or "?"
        args = {"planned bytes": event.nbytes, "chunks": event.chunks, "chunk length": event.chunk_length}
        batch = _Span(event.time, "batch", {**args, "detail": event.detail})
        self.batches.setdefault(group, []).append(batch)
        self._planned[group] = batch
        self._waits.pop(group, None)  # what waited was planned: a later wait is another

    def _allocate(self, event: HistoryRecord) -> None:
        instance, group = event.instance or "?", event.group or "?"
        key = (event.time, instance, group)
        if self._request is None or self._request[0] != key:  # a response's arrays are recorded together
            name = "request" if event.chunks is not None else "counted bytes"  # another library's, counted
            args = {
                "group": group,
                "bytes": 0,
                "arrays": {},
                "chunks": event.chunks,
                "chunk length": event.chunk_length,
            }
            batch = self._planned.get(group) if event.chunks is not None else None
            # a request's span: from its batch's plan (planned), its arrays' allocation (allocated) to
            # the release of its last array (released)
            request = _Span(event.time if batch is None else batch.start, name, args)
            self.requests.setdefault(instance, []).append(request)
            self._request = (key, request)
            if batch is not None:  # planned, then allocated: its arrays inside, and its flight to the device
                request.add(batch.start, "planned", end=event.time)
                request.inner = request.add(event.time, "allocated")
                self._asked.setdefault(instance, deque()).append(request)
                self._flying.setdefault(instance, deque()).append(request)
                served = self._served.setdefault(id(batch), [])
                if not served:  # the batch's allocation, as on its requests' tracks
                    batch.children.append(_Span(batch.start, "allocate", {}, end=event.time))
                served.append(request)
        request = self._request[1]
        array = _Span(event.time, event.label or "?", {"bytes": event.nbytes, "memory": event.memory_kind})
        request.inner.children.append(array)
        request.args["bytes"] += event.nbytes
        request.args["arrays"][event.label or "?"] = event.nbytes
        self._held.setdefault((instance, event.label), deque()).append(array)

    def _release(self, event: HistoryRecord) -> None:
        held = self._held.get((event.instance or "?", event.label))
        if held:
            held.popleft().end = event.time
        else:  # allocated before the history's oldest event
            args = {"bytes": event.nbytes, "detail": "allocated before the history's first event"}
            self.marks.append((event.time, INSTANCES, event.instance or "?", f"release {event.label}", args))

    def _way(self, kind: str, event: HistoryRecord) -> None:
        """A request's queue wait ended (``queued``: it starts when it was asked), or it is ready."""
        instance = event.instance or "?"
        waiting = (self._asked if kind == "queued" else self._flying).get(instance)
        if kind == "ready":  # a request freed whole before the next was allocated failed in flight (invalidate_all)
            while waiting and len(waiting) > 1 and _gone(waiting[0], waiting[1].inner.start):
                waiting.popleft()
        if not waiting:  # allocated before the history's oldest event
            return
        request = waiting.popleft()
        request.args["priority"] = event.priority
        if kind == "queued" and event.since is not None:
            planned = request.start
            request.start = min(event.since, planned)
            request.args["queued (us)"] = round((planned - request.start) * 1e6, 3)
            request.children.insert(0, _Span(request.start, "queued", {"priority": event.priority}, end=planned))
        elif kind == "ready":
            held = request.inner
            request.args["ready after allocation (us)"] = round((event.time - held.start) * 1e6, 3)
            if event.time > held.start:
                held.add(held.start, "in flight", end=event.time)
            self.marks.append((event.time, INSTANCES, instance, "ready", {"priority": event.priority}))

    def _wait(self, event: HistoryRecord) -> None:
        """A batch's wait on its group's track; steps of one wait that follow each other are one span."""
        # ``since`` is perf_counter moved onto monotonic: where monotonic ticks coarser (Windows before
        # Python 3.13: 15.6 ms), a short wait's start can read after its end
        group, since = event.group or "?", event.time if event.since is None else min(event.since, event.time)
        name = f"wait: {event.detail}"
        last = self._waits.get(group)
        # the next look of the same wait starts as soon as the last one's re-plan is done (a few ms under a
        # loaded CPU); a batch planned or failed in between ends it (see _plan and read)
        if last is not None and last.name == name and last.end is not None and since - last.end < _LOOKS_APART:
            last.end = event.time
            last.args["steps"] += 1
            return
        wait = _Span(since, name, {"priority": event.priority, "steps": 1}, end=event.time)
        self.batches.setdefault(group, []).append(wait)
        self._waits[group] = wait

    def _walk(self, event: HistoryRecord) -> None:
        """A step of a walk's chunk: its copy in, its body, its copy out, its outputs landed."""
        instance, index, step = event.instance or "?", event.chunk or 0, event.label
        key = (instance, event.detail, index)  # walks of one instance at once: each over its own response
        if step == "copy in":
            left = self._chunks.pop(key, None)
            if left is not None:  # the last walk over its response left early
                _cut(left)
            began = self._chunks[key] = _Span(event.time, f"chunk {index}", {"chunk": index})
            began.add(event.time, "host->device")
            self.walks.setdefault(instance, []).append(began)
            return
        chunk = self._chunks.get(key)
        if chunk is None:  # its copy in is before the history's oldest event
            return
        chunk.children[-1].end = event.time
        if step == "landed":
            chunk.end = event.time
            del self._chunks[key]
        else:
            chunk.add(event.time, "body" if step == "body" else "device->host")

    def _forget(self, at: float) -> None:
        """A context reset: every array is gone (and the requests in flight never become ready)."""
        self._asked.clear()
        self._flying.clear()
        for held in self._held.values():
            for array in held:
                array.end = at
                array.args["ended by"] = "context reset"
        self._held.clear()


def _gone(request: _Span, at: float) -> bool:
    """Whether every array of ``request`` was freed by ``at``."""
    return all(array.end is not None and array.end <= at for array in request.inner.children)


def _cut(chunk: _Span) -> None:
    """A chunk of a walk that was left early: it ends at its last step."""
    chunk.end = max(c.end or c.start for c in chunk.children)
    for step in chunk.children:
        step.end = step.start if step.end is None else step.end


class _Tracks:
    """Thread ids of named tracks: one a track, lanes where its spans overlap."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, str], int] = {}

    def tid(self, pid: int, name: str) -> int:
        return self.ids.setdefault((pid, name), len(self.ids) + 1)

    def metadata(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for pid, name in _PROCESSES.items():
            out.append({"ph": "M", "ts": 0, "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            out.append(
                {"ph": "M", "ts": 0, "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
            )
        for (pid, name), tid in self.ids.items():
            out.append({"ph": "M", "ts": 0, "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            out.append(
                {"ph": "M", "ts": 0, "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
            )
        return out


def _lanes(spans: Sequence[_Span]) -> list[list[_Span]]:
    """``spans`` in as few lanes as keep each lane's spans apart (a track's slices must nest)."""
    lanes: list[list[_Span]] = []
    ends: list[float] = []
    for span in sorted(spans, key=lambda s: s.start):
        lane = next((i for i, end in enumerate(ends) if end <= span.start), len(ends))
        if lane == len(ends):
            lanes.append([])
            ends.append(0.0)
        lanes[lane].append(span)
        ends[lane] = span.end if span.end is not None else span.start
    return lanes


def trace_events(
    events: Sequence[HistoryRecord],
    snapshots: Sequence[Snapshot] = (),
    *,
    wall_base: float | None = None,
    dropped: int = 0,
) -> dict[str, Any]:
    """The Trace Event format's JSON object of a history's ``events`` (and a Recorder's ``snapshots``).

    Timestamps are microseconds since the first event or snapshot. See :meth:`History.to_perfetto`
    for what each track shows.
    """
    snapshots = list(snapshots)
    for snapshot in snapshots:
        if not isinstance(snapshot, Snapshot):
            raise ConfigurationError(
                f"snapshots are a Recorder's (recorder.snapshots), got {shown(snapshot)} among them"
            )
    # a request's queue wait and a batch's wait begin before they are recorded (``since``)
    times = [e.time for e in events[:1]] + [s.time for s in snapshots[:1]]
    times += [e.since for e in events if e.since is not None]
    origin = min(times, default=0.0)

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    timeline = _Timeline()
    timeline.read(events)
    tracks = _Tracks()
    out: list[dict[str, Any]] = []
    for pid, track, table in (
        (GROUPS, "group {}", timeline.batches),
        (INSTANCES, "{}", timeline.requests),
        (INSTANCES, "{}: walks", timeline.walks),
    ):
        for name, spans in table.items():
            for index, lane in enumerate(_lanes(spans)):
                tid = tracks.tid(pid, track.format(name) + (f" ({index + 1})" if index else ""))
                for span in lane:
                    _complete(out, span, pid, tid, us)
    for t, pid, track, name, args in timeline.marks:
        scope = {"s": "t", "tid": tracks.tid(pid, track)} if track else {"s": "g", "tid": 0}
        out.append({"ph": "i", "name": name, "cat": "aiocubie", "ts": us(t), "pid": pid, **scope, "args": args})
    out += _live_counters(events, us)
    for snapshot in snapshots:
        for name, read in SNAPSHOT_COUNTERS.items():
            series = {key: value for key, value in read(snapshot).items() if value is not None}
            if series:
                out.append({"ph": "C", "name": name, "ts": us(snapshot.time), "pid": DEVICE, "tid": 0, "args": series})
    other = {"source": "aiocubie allocation history", "events dropped before the first": str(dropped)}
    if wall_base is not None:
        other["wall clock at ts 0 (s since the epoch)"] = f"{wall_base + origin:.6f}"
    return {"traceEvents": tracks.metadata() + out, "displayTimeUnit": "ms", "otherData": other}


def _complete(out: list[dict[str, Any]], span: _Span, pid: int, tid: int, us: Callable[[float], float]) -> None:
    """``span`` and the spans inside it as complete ("X") events, each before the ones it holds."""
    start, end = us(span.start), us(span.end if span.end is not None else span.start)
    out.append({"ph": "X", "name": span.name, "cat": "aiocubie", "ts": start, "dur": round(end - start, 3),
                "pid": pid, "tid": tid, "args": span.args})  # fmt: skip
    for child in sorted(span.children, key=lambda c: (c.start, -(c.end or c.start))):
        _complete(out, child, pid, tid, us)


def _live_counters(events: Sequence[HistoryRecord], us: Callable[[float], float]) -> list[dict[str, Any]]:
    """ "live bytes" counters: one series per group (on the groups' process) and per instance."""
    out: list[dict[str, Any]] = []
    live: dict[int, dict[str, int]] = {GROUPS: {}, INSTANCES: {}}
    latest: dict[int, dict[str, Any]] = {}  # pid -> its last counter event
    for event in events:
        changed = []
        if str(getattr(event.kind, "value", event.kind)) == "reset" and event.detail.startswith("context"):
            for table in live.values():
                table.update(dict.fromkeys(table, 0))
            changed = [GROUPS, INSTANCES]
        for pid, name, value in (
            (GROUPS, event.group, event.group_live),
            (INSTANCES, event.instance, event.instance_live),
        ):
            if name is not None and value is not None:
                live[pid][name] = value
                changed.append(pid)
        for pid in dict.fromkeys(changed):
            ts = us(event.time)
            last = latest.get(pid)
            if last is not None and last["ts"] == ts:  # a batch's arrays, recorded at once: one value
                last["args"] = dict(live[pid])
            elif live[pid]:
                latest[pid] = {"ph": "C", "name": "live bytes", "ts": ts, "pid": pid, "tid": 0, "args": dict(live[pid])}
                out.append(latest[pid])
    return out


def write(trace: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` (see :func:`trace_events`) to ``path`` as JSON; return the path.

    Raises
    ------
    ConfigurationError
        If ``path`` is not a path, or cannot be written.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigurationError(f"a trace is written to a file: pass its path, got {shown(path)}")
    out = Path(path)
    try:
        with open(out, "w", encoding="utf-8") as file:
            json.dump(trace, file, separators=(",", ":"))
    except OSError as exc:
        raise ConfigurationError(f"cannot write the trace to {str(out)!r}: {exc.strerror or exc}") from exc
    return out
