"""The history as a trace (History.to_perfetto): checked against the Trace Event format, its tracks and
bytes against the history, through the command line, and (where a trace processor is at hand) by Perfetto."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from simkit import TOTAL, Part, hold_stream, vec

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager, walk_chunks, walk_requests
from aiocubie.__main__ import main as cli
from aiocubie.errors import ConfigurationError, ContextResetError
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import EventKind, History, HistoryEvent, Recorder, render_history

pytestmark = pytest.mark.anyio

#: The Trace Event format's phases (its spec, "The Trace Event Format", Google, and Perfetto's JSON importer).
PHASES = set("BEXiIbenCMsftPONDcRrvV")
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
NS = 1e-3  # timestamps are microseconds with three decimals


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_trace_event_format(trace: Any) -> list[dict[str, Any]]:
    """Assert that ``trace`` is a Trace Event format JSON object a viewer reads whole; return its events.

    Per the spec: the object form with ``traceEvents``; every event a phase, a pid and tid, a name
    and a timestamp (metadata aside); complete events a duration >= 0, nested on their track (a slice
    that starts inside another ends inside it); B/E pairs matched, in time order on their track;
    async events a category and an id, each begun once and ended after; counters numeric series;
    instants a scope; every track with a slice named by metadata.
    """
    assert isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list), "the JSON object form"
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns")
    json.dumps(trace, allow_nan=False)  # plain JSON: no NaN, no infinities, nothing unserialisable
    events = trace["traceEvents"]
    named: set[tuple[int, int]] = set()
    begun: dict[tuple[int, int], list[dict[str, Any]]] = {}
    last: dict[tuple[int, int], float] = {}
    opened: dict[tuple[str, object], float] = {}
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in events:
        ph = event.get("ph")
        assert ph in PHASES, f"unknown phase {ph!r}: {event}"
        assert isinstance(event.get("pid"), int) and isinstance(event.get("tid", 0), int), event
        track = (event["pid"], event.get("tid", 0))
        if ph == "M":
            assert event["name"] in METADATA and isinstance(event.get("args"), dict), event
            key = "name" if event["name"].endswith("_name") else "sort_index"
            assert isinstance(event["args"][key], str if key == "name" else int), event
            if event["name"] == "thread_name":
                named.add(track)
            continue
        assert isinstance(event.get("name"), str) and event["name"], event
        assert _number(event.get("ts")) and event["ts"] >= 0, event
        assert isinstance(event.get("args", {}), dict), event
        if ph == "X":
            assert _number(event.get("dur")) and event["dur"] >= 0, event
            slices.setdefault(track, []).append((event["ts"], event["ts"] + event["dur"]))
        elif ph in "BE":
            assert event["ts"] >= last.get(track, -math.inf), f"B/E out of time order on {track}: {event}"
            last[track] = event["ts"]
            stack = begun.setdefault(track, [])
            if ph == "B":
                stack.append(event)
                slices.setdefault(track, [])
            else:
                assert stack, f"an E with no B on {track}: {event}"
                began = stack.pop()
                assert event.get("name", began["name"]) == began["name"], (began, event)
        elif ph in "ben":
            assert isinstance(event.get("cat"), str) and ("id" in event or "id2" in event), (
                f"async needs cat, id: {event}"
            )
            key = (event["cat"], event.get("id", event.get("id2")))
            if ph == "b":
                assert key not in opened, f"async {key} begun twice"
                opened[key] = event["ts"]
            elif ph == "e":
                assert key in opened and opened.pop(key) <= event["ts"], f"async {key} ended before it began"
        elif ph == "C":
            series = event.get("args")
            assert series and all(_number(v) for v in series.values()), f"a counter's series are numbers: {event}"
        elif ph in "iI":
            assert event.get("s", "t") in ("g", "p", "t"), event
    assert not any(begun.values()), f"B events never ended: {begun}"
    assert not opened, f"async events never ended: {opened}"
    for track, spans in slices.items():
        assert track in named, f"track {track} has slices but no thread_name"
        ends: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while ends and ends[-1] <= start + NS:
                ends.pop()
            assert not ends or end <= ends[-1] + NS, f"slices overlap without nesting on {track}: ends at {end}"
            ends.append(end)
    return events


def test_the_validator_refuses_what_a_viewer_would_not_read() -> None:
    good = {"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1}
    name = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}}
    check_trace_event_format({"traceEvents": [name, good]})
    bad = [
        [good],  # a track without a name
        [name, good, {**good, "ts": 5, "dur": 10}],  # overlapping, not nested
        [name, {"ph": "E", "name": "a", "ts": 1, "pid": 1, "tid": 1}],  # E without B
        [name, {"ph": "B", "name": "a", "ts": 5, "pid": 1, "tid": 1}],  # B never ended
        [name, {"ph": "b", "name": "a", "cat": "c", "ts": 1, "pid": 1, "tid": 1}],  # async without an id
        [name, {"ph": "C", "name": "c", "ts": 1, "pid": 1, "tid": 0, "args": {"x": "12"}}],  # not a number
        [name, {**good, "ts": -1}],
        [name, {**good, "ph": "Q"}],
    ]
    for events in bad:
        with pytest.raises(AssertionError):
            check_trace_event_format({"traceEvents": events})


async def _workload(mgr: MemoryManager) -> None:
    """Two members of "solve" asking at once (one batch), one of "load" holding two responses at once,
    one of them chunked; everything released."""
    a, b, c = Part(), Part(), Part()
    mgr.register(a, stream_group="solve", name="a")
    mgr.register(b, stream_group="solve", name="b")
    mgr.register(c, stream_group="load", name="c")
    held: dict[str, ArrayResponse] = {}

    async def ask(part: Part, name: str) -> None:
        held[name] = await mgr.request(part, {"x": vec(1000), "p": vec(10, unchunkable=True)})

    async with anyio.create_task_group() as both:
        both.start_soon(ask, a, "a")
        both.start_soon(ask, b, "b")
    first = await mgr.request(c, {"y": vec(2000)})
    async with mgr.request(c, {"y": vec(TOTAL // 8 * 3)}) as big:  # over what is free: chunked
        assert big.chunks > 1
    for response in (first, *held.values()):
        mgr.release(response)


async def _history(sim: SimulatorBackend) -> History:
    async with MemoryManager(sim) as mgr:
        mgr.record_history()
        await _workload(mgr)
        return mgr.history()


def _tracks(events: Iterable[dict[str, Any]]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}


async def test_each_group_and_instance_has_its_track_with_its_requests_and_bytes(
    sim: SimulatorBackend, tmp_path: Path
) -> None:
    history = await _history(sim)
    path = history.to_perfetto(tmp_path / "trace.json")
    events = check_trace_event_format(json.loads(path.read_text()))
    tracks = _tracks(events)
    # c holds two responses at once: its track, and load's, in two lanes
    assert set(tracks.values()) == {"group solve", "group load", "group load (2)", "a", "b", "c", "c (2)"}
    by_track: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event["ph"] == "X":
            by_track.setdefault(tracks[event["pid"], event["tid"]], []).append(event)
    batches = [e for e in by_track["group solve"] if e["name"] == "batch"]
    assert len(batches) == 1 and batches[0]["args"]["detail"].startswith("2 request(s)")  # a and b: one batch
    assert [len([e for e in by_track[f"group load{lane}"] if e["name"] == "batch"]) for lane in ("", " (2)")] == [1, 1]
    allocated: dict[str, int] = {}
    for event in history.events:
        if event.kind is EventKind.ALLOCATE:
            allocated[event.group] = allocated.get(event.group, 0) + event.nbytes
    traced: dict[str, int] = {}
    for name in ("a", "b", "c", "c (2)"):
        for request in (e for e in by_track[name] if e["name"] == "request"):
            traced[request["args"]["group"]] = traced.get(request["args"]["group"], 0) + request["args"]["bytes"]
            arrays = {e["name"]: e["args"]["bytes"] for e in by_track[name] if e["name"] in request["args"]["arrays"]}
            assert arrays == request["args"]["arrays"]
    assert traced == allocated and allocated["solve"] == 2 * (1000 + 10) * 8
    solve = by_track["a"][0]  # a's request: queued, planned with the batch, allocated, released
    queued, planned = by_track["a"][1:3]
    assert (solve["name"], queued["name"], planned["name"]) == ("request", "queued", "planned")
    assert solve["ts"] == queued["ts"] < planned["ts"] == batches[0]["ts"]
    assert queued["ts"] + queued["dur"] == pytest.approx(planned["ts"], abs=1e-3)
    assert solve["ts"] + solve["dur"] <= batches[0]["ts"] + batches[0]["dur"] + 1e-3
    live = [e for e in events if e["ph"] == "C" and e["name"] == "live bytes" and e["pid"] == 1]
    peaks = {g: max(e["args"].get(g, 0) for e in live) for g in ("solve", "load")}
    assert peaks == {g: max(values) for g, (_, values) in history.series().items()}
    assert live[-1]["args"] == {"solve": 0, "load": 0}


def _spans(events: list[dict[str, Any]], track: str) -> list[dict[str, Any]]:
    """The complete events of ``track``, each before those inside it."""
    tracks = _tracks(events)
    return [e for e in events if e["ph"] == "X" and tracks[e["pid"], e["tid"]] == track]


def _inside(outer: dict[str, Any], inner: dict[str, Any]) -> bool:
    return outer["ts"] - NS <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + NS


async def test_a_requests_way_queued_planned_in_flight_ready_released(sim: SimulatorBackend, tmp_path: Path) -> None:
    """Each request: queued (from when it was asked), planned, allocated (its arrays, its flight to the
    device until the event is reached), a "ready" mark, its priority; the plot reads the same history."""
    async with MemoryManager(sim, batch_window=0.005) as mgr:
        mgr.record_history()
        a, b = Part(), Part()
        mgr.register(a, stream_group="g", name="a", priority=3)
        mgr.register(b, stream_group="g", name="b")
        gate = hold_stream(mgr.groups.stream(a))  # the batch's event is reached only once the gate opens

        async def ask() -> None:
            await mgr.request(a, {"x": vec(100)})

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ask)
            await anyio.sleep(0.02)
            first = mgr.history()
            opened = time.monotonic()
            gate.set()
        await mgr.request(b, {"y": vec(10)})
        mgr.free_all()
        history = mgr.history()
    kinds = [e.kind.value for e in history.events if e.instance == "a"]
    assert kinds == ["allocate", "queued", "ready", "release"]
    queued = next(e for e in history.events if e.kind is EventKind.QUEUED and e.instance == "a")
    assert queued.priority == 3 and queued.since is not None and queued.since < history.events[0].time
    assert not any(e.kind is EventKind.READY for e in first.events)  # not before the device was there
    (ready_a,) = [e for e in history.events if e.kind is EventKind.READY and e.instance == "a"]
    assert ready_a.time >= opened  # when the stream's work was done
    events = check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "t.json").read_text()))
    request, waited, planned, allocated, *inside = _spans(events, "a")
    assert [request["name"], waited["name"], planned["name"], allocated["name"]] == [
        "request", "queued", "planned", "allocated"
    ]  # fmt: skip
    assert request["args"]["priority"] == 3 and request["args"]["queued (us)"] > 0
    for before, after in ((waited, planned), (planned, allocated)):  # one after the other, inside the request
        assert before["ts"] + before["dur"] == pytest.approx(after["ts"], abs=NS) and _inside(request, after)
    flight = next(e for e in inside if e["name"] == "in flight")
    assert flight["dur"] > 0 and _inside(allocated, flight)  # the gate held the stream
    assert {e["name"] for e in inside} == {"in flight", "x"} and all(_inside(allocated, e) for e in inside)
    (ready,) = [
        e for e in events if e["ph"] == "i" and e["name"] == "ready" and _tracks(events)[e["pid"], e["tid"]] == "a"
    ]
    assert ready["ts"] == pytest.approx(flight["ts"] + flight["dur"], abs=NS)
    assert [e["name"] for e in _spans(events, "b")][:4] == ["request", "queued", "planned", "allocated"]
    assert render_history(history, tmp_path / "h.html").read_text().count("queued") >= 1


async def test_a_batchs_wait_is_one_span_on_its_group_track(sim: SimulatorBackend, tmp_path: Path) -> None:
    """Under policy wait a batch that does not fit waits for a release: one span however many times it looked."""
    async with MemoryManager(sim, mode="active", policy="wait", batch_window=0) as mgr:
        holder, waiter = Part(), Part()
        mgr.register(holder, proportion=0.25, stream_group="g", name="holder")
        mgr.register(waiter, proportion=0.25, stream_group="g", name="waiter", priority=2)
        mgr.record_history()
        held = await mgr.request(holder, {"x": vec(TOTAL // 8 * 2 // 5)})  # 0.4 of the device

        async def ask() -> None:
            await mgr.request(waiter, {"y": vec(TOTAL // 8 * 3 // 10, unchunkable=True)})

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ask)
            await anyio.sleep(0.15)  # three of the scheduler's 50 ms looks
            mgr.release(held)
        mgr.free_all()
        history = mgr.history()
    events = check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "t.json").read_text()))
    waits = [e for e in events if e["ph"] == "X" and e["name"].startswith("wait:")]
    assert [w["name"] for w in waits] == ["wait: memory (policy wait) (1 request(s))"]
    (wait,) = waits
    assert wait["dur"] >= 120_000 and wait["args"]["priority"] == 2 and wait["args"]["steps"] >= 2
    assert _tracks(events)[wait["pid"], wait["tid"]].startswith("group g")
    (request,) = [e for e in _spans(events, "waiter") if e["name"] == "request"]
    assert request["ts"] <= wait["ts"] and request["args"]["queued (us)"] >= wait["dur"]


async def test_a_wait_that_ends_after_the_history_stopped_is_not_recorded(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", policy="wait", batch_window=0) as mgr:
        holder, waiter = Part(), Part()
        mgr.register(holder, proportion=0.25, stream_group="g", name="holder")
        mgr.register(waiter, proportion=0.25, stream_group="g", name="waiter")
        mgr.record_history()
        held = await mgr.request(holder, {"x": vec(TOTAL // 8 * 2 // 5)})

        async def ask() -> None:
            await mgr.request(waiter, {"y": vec(TOTAL // 8 * 3 // 10, unchunkable=True)})

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ask)
            await anyio.sleep(0.02)  # inside one of the scheduler's 50 ms looks
            mgr.record_history(False)
            stopped = mgr.history()
            mgr.release(held)
        mgr.free_all()
        after = mgr.history()
    assert [(e.kind, e.time) for e in after.events] == [(e.kind, e.time) for e in stopped.events]  # no wait added


@pytest.mark.parametrize("depth", [1, 2])
async def test_a_walks_chunks_with_their_copies(tmp_path: Path, depth: int) -> None:
    """Each chunk a span on the instance's walk track: host->device, the body, device->host, one after the other."""
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    y = np.empty_like(x)
    with SimulatorBackend(total=16 << 10) as sim:  # the 32 KiB walk: chunked
        async with MemoryManager(sim) as mgr:
            part = Part()
            mgr.register(part, name="p")
            mgr.record_history()
            requests = walk_requests({"x": ArrayRequest.like(x), "y": ArrayRequest.like(y)})
            async with mgr.request(part, requests) as response:
                async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, depth=depth):
                    chunk.device["y"][...] = 2 * chunk.device["x"]
                chunks = response.chunks
            assert chunks > 2 and (y == 2 * x).all()
            async with mgr.request(part, {"z": ArrayRequest.like(x[0])}) as whole:  # one chunk: straight
                async for _chunk in walk_chunks(whole, inputs={"z": x[0]}, outputs={"z": np.empty_like(x[0])}):
                    pass
            history = mgr.history()
    steps = [(e.chunk, e.label) for e in history.events if e.kind is EventKind.WALK]
    for index in range(chunks):
        mine = [step for i, step in steps if i == index]
        assert mine[:4] == ["copy in", "body", "copy out", "landed"]
    events = check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "t.json").read_text()))
    tracks = _tracks(events)
    walked = [e for e in events if e["ph"] == "X" and tracks[e["pid"], e["tid"]].startswith("p: walks")]
    spans = sorted((e for e in walked if e["name"].startswith("chunk")), key=lambda e: e["ts"])
    assert [s["name"] for s in spans] == [f"chunk {i}" for i in range(chunks)] + ["chunk 0"]
    for span in spans:
        copies = [e for e in walked if e["tid"] == span["tid"] and e is not span and _inside(span, e)]
        copies = [e for e in copies if not e["name"].startswith("chunk")]
        assert [e["name"] for e in copies] == ["host->device", "body", "device->host"]
        assert copies[0]["ts"] == span["ts"] and copies[-1]["ts"] + copies[-1]["dur"] == pytest.approx(
            span["ts"] + span["dur"], abs=NS
        )
    if depth > 1:  # overlapped: the next chunk's copy in before this one's body ended: lanes
        assert len({s["tid"] for s in spans}) > 1


async def test_walks_of_one_instance_at_once_each_have_their_chunks(tmp_path: Path) -> None:
    """Two tasks of one component walk their own responses at the same time: a chunk span each, with its steps."""
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    with SimulatorBackend(total=64 << 10) as sim:
        async with MemoryManager(sim) as mgr:
            part = Part()
            mgr.register(part, name="p")
            mgr.record_history()

            async def walk() -> None:
                async with mgr.request(part, walk_requests({"x": ArrayRequest.like(x)}, 1)) as response:
                    async for _chunk in walk_chunks(response, inputs={"x": x}, depth=1):
                        await anyio.sleep(0.001)
                    assert response.chunks == 1

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(walk)
                tasks.start_soon(walk)
            history = mgr.history()
    events = check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "t.json").read_text()))
    chunks = [e for e in events if e["ph"] == "X" and e["name"] == "chunk 0"]
    assert len(chunks) == 2
    for chunk in chunks:
        inside = [e["name"] for e in events if e["ph"] == "X" and (e["pid"], e["tid"]) == (chunk["pid"], chunk["tid"])
                  and e is not chunk and chunk["ts"] <= e["ts"] <= chunk["ts"] + chunk["dur"]]  # fmt: skip
        assert inside == ["host->device", "body", "device->host"]


async def test_a_walk_left_early_ends_its_chunks_at_their_last_step(tmp_path: Path) -> None:
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    with SimulatorBackend(total=16 << 10) as sim:
        async with MemoryManager(sim) as mgr:
            part = Part()
            mgr.register(part, name="p")
            mgr.record_history()
            requests = walk_requests({"x": ArrayRequest.like(x)})
            async with mgr.request(part, requests) as response:
                for _ in range(2):  # left at its second chunk, then walked whole
                    async with contextlib.aclosing(walk_chunks(response, inputs={"x": x}, depth=1)) as chunks:
                        async for chunk in chunks:
                            if chunk.index == 1 and _ == 0:
                                break
            history = mgr.history()
    events = check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "t.json").read_text()))
    chunks = sorted((e for e in events if e["ph"] == "X" and e["name"].startswith("chunk")), key=lambda e: e["ts"])
    assert [c["name"] for c in chunks][:3] == ["chunk 0", "chunk 1", "chunk 0"]
    left = chunks[1]  # its body, cut where the walk was left: no copy out
    inside = [e["name"] for e in events if e["ph"] == "X" and e["tid"] == left["tid"] and e is not left
              and left["ts"] <= e["ts"] <= left["ts"] + left["dur"] + NS and not e["name"].startswith("chunk")]  # fmt: skip
    assert inside[:2] == ["host->device", "body"] and "device->host" not in inside[:2]
    assert 0 < left["dur"] and left["ts"] + left["dur"] < chunks[2]["ts"]


async def test_a_walk_records_to_the_history_recording_when_it_walks() -> None:
    """Not to the one recording when its response was allocated: a stopped history stays as it was, a new
    one has the walks of a response allocated before it began."""
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)

    async def walked(response: ArrayResponse, mgr: MemoryManager) -> int:
        async for _chunk in walk_chunks(response, inputs={"x": x}):
            pass
        return sum(e.kind is EventKind.WALK for e in mgr.history().events)

    with SimulatorBackend(total=16 << 10) as sim:
        async with MemoryManager(sim) as mgr:
            part = Part()
            mgr.register(part, name="p")
            async with mgr.request(part, walk_requests({"x": ArrayRequest.like(x)})) as response:
                mgr.record_history()
                steps = await walked(response, mgr)
                assert steps >= 4 * response.chunks
                mgr.record_history(False)
                assert await walked(response, mgr) == steps  # stopped: nothing more
                mgr.record_history()
                assert await walked(response, mgr) == steps  # a new history: this walk's steps


def test_a_wait_that_reads_as_starting_after_it_ended_is_drawn_from_its_end(tmp_path: Path) -> None:
    """Its start is perf_counter moved onto monotonic: where monotonic ticks coarser (Windows before
    Python 3.13), it can read later than the event's time. No negative duration."""
    detail = "memory (policy wait) (1 request(s))"
    wait = HistoryEvent("wait", 1.010, "g", detail=detail, priority=0, since=1.020)
    history = History((HistoryEvent("plan", 1.0, "g", chunks=1, chunk_length=1, detail="x"), wait), 0.0)
    events = check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "t.json").read_text()))
    (drawn,) = [e for e in events if e["ph"] == "X" and e["name"] == f"wait: {detail}"]
    assert drawn["dur"] == 0 and drawn["ts"] == pytest.approx(10_000, abs=NS)


async def test_a_recorders_snapshots_add_the_pool_and_other_libraries(sim: SimulatorBackend, tmp_path: Path) -> None:
    async with MemoryManager(sim) as mgr:
        mgr.record_history()
        recorder = Recorder(mgr)
        recorder.take()
        part = Part()
        mgr.register(part, stream_group="g", name="p")
        async with mgr.request(part, {"x": vec(1000)}):
            recorder.take()
        recorder.take()
        history = mgr.history()
    path = history.to_perfetto(tmp_path / "trace.json", snapshots=recorder.snapshots)
    events = check_trace_event_format(json.loads(path.read_text()))
    device = [e for e in events if e["ph"] == "C" and e["pid"] == 3]
    assert {e["name"] for e in device} == {"device memory", "allocator pool", "other libraries", "spilled to host"}
    assert [e["args"]["held by this manager"] for e in device if e["name"] == "device memory"] == [0, 8000, 0]
    assert next(e["ts"] for e in device if e["name"] == "device memory") == 0  # the first snapshot is the origin


async def test_spilled_bytes_are_a_counter_track(tmp_path: Path) -> None:
    with SimulatorBackend(total=1_000_000) as sim:
        async with MemoryManager(sim, mode="active", policy="chunk") as mgr:
            cache, stage = Part(), Part()
            mgr.register(cache, proportion=0.5, stream_group="a")
            mgr.register(stage, proportion=0.4, stream_group="a")
            mgr.record_history()
            recorder = Recorder(mgr)
            table = await mgr.request(cache, {"c": ArrayRequest((25_000,), "f8", spillable=True)})
            recorder.take()
            async with mgr.request(stage, {"x": ArrayRequest((90_000,), "f8")}) as big:  # the idle table goes
                assert big.chunks == 1
                recorder.take()
            async with table.use():  # and comes back
                recorder.take()
            table.release()
            history = mgr.history()
    path = history.to_perfetto(tmp_path / "trace.json", snapshots=recorder.snapshots)
    events = check_trace_event_format(json.loads(path.read_text()))
    spilled = [e["args"]["now"] for e in events if e["ph"] == "C" and e["name"] == "spilled to host"]
    assert spilled == [0, 200_000, 0]


async def test_marks_and_a_context_reset_end_every_span(sim: SimulatorBackend, tmp_path: Path) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, stream_group="g", name="p")
        early = await mgr.request(part, {"x": vec(100)})  # allocated before the history: its release is a mark
        mgr.record_history()
        sim.faults.inject("allocate")
        with pytest.raises(Exception, match="injected fault"):
            await mgr.request(part, {"y": vec(10)})
        mgr.release(early)
        await mgr.request(part, {"z": vec(50)})  # held until the context reset
        with pytest.warns(Warning, match="resets the device context"):
            mgr.pool.set_allocator("cupy")
        history = mgr.history()
    events = check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "t.json").read_text()))
    marks = {e["name"] for e in events if e["ph"] == "i"}
    assert {"failure", "reset", "release x"} <= marks
    (z,) = [e for e in events if e["ph"] == "X" and e["name"] == "z"]
    reset = next(e for e in events if e["ph"] == "i" and e["name"] == "reset")
    assert z["args"]["ended by"] == "context reset" and z["ts"] + z["dur"] == pytest.approx(reset["ts"], abs=1e-3)


async def test_a_request_failed_in_flight_by_invalidate_all_is_not_ready_later(
    sim: SimulatorBackend, tmp_path: Path
) -> None:
    """invalidate_all fails the requests in flight (they are never ready): the next request's ready is its own."""
    async with MemoryManager(sim, batch_window=0.001) as mgr:
        part = Part()
        mgr.register(part, stream_group="g", name="p")
        mgr.record_history()
        gate = hold_stream(mgr.groups.stream(part))

        async def ask() -> None:
            with pytest.raises(ContextResetError):
                await mgr.request(part, {"x": vec(100)})

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(ask)
            await anyio.sleep(0.02)
            mgr.pool.invalidate_all()
        gate.set()
        await anyio.sleep(0.02)
        await mgr.request(part, {"y": vec(10)})
        mgr.free_all()
        history = mgr.history()
    events = check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "t.json").read_text()))
    tracks = _tracks(events)
    requests = sorted((e for e in events if e["name"] == "request" and tracks[e["pid"], e["tid"]].startswith("p")),
                      key=lambda e: e["ts"])  # fmt: skip
    (x,) = [e for e in events if e["ph"] == "X" and e["name"] == "x"]
    assert [r["args"]["arrays"] for r in requests] == [{"x": 800}, {"y": 80}]
    assert requests[0]["ts"] + requests[0]["dur"] == pytest.approx(x["ts"] + x["dur"], abs=NS)  # not to y's ready
    ready = "ready after allocation (us)"
    assert ready not in requests[0]["args"] and ready in requests[1]["args"]
    assert len({tracks[r["pid"], r["tid"]] for r in requests}) == 1  # one after the other: one lane


def test_refusals_name_what_is_wrong(tmp_path: Path) -> None:
    history = History((), 0.0)
    check_trace_event_format(json.loads(history.to_perfetto(tmp_path / "empty.json").read_text()))
    with pytest.raises(ConfigurationError, match="pass its path"):
        history.to_perfetto(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"recorder\.snapshots"):
        history.to_perfetto(tmp_path / "t.json", snapshots=[1])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="cannot write the trace"):
        history.to_perfetto(tmp_path / "no" / "such" / "t.json")


async def test_cli_history_exports_what_the_method_writes(
    sim: SimulatorBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = await _history(sim)
    history.to_json(tmp_path / "h.json")
    args = ["history", str(tmp_path / "h.json"), "--perfetto", str(tmp_path / "cli.json")]
    assert cli([*args, "--memory-viz", str(tmp_path / "cli.pickle")]) == 0
    out = capsys.readouterr().out
    assert "traced in" in out and "pytorch.org/memory_viz" in out and "drawn in" not in out
    assert not (tmp_path / "h.html").exists()  # exports alone: no picture unless --out asks
    loaded = History.load(tmp_path / "h.json")
    expected = json.loads(loaded.to_perfetto(tmp_path / "method.json").read_text())
    assert json.loads((tmp_path / "cli.json").read_text()) == expected
    check_trace_event_format(expected)
    assert (tmp_path / "cli.pickle").read_bytes() == loaded.to_memory_viz(tmp_path / "m.pickle").read_bytes()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_perfetto_trace_processor_reads_the_tracks(sim: SimulatorBackend, tmp_path: Path) -> None:
    """Optional: needs the perfetto package and a trace_processor_shell binary ($AIOCUBIE_TRACE_PROCESSOR),
    which it would otherwise download."""
    binary = os.environ.get("AIOCUBIE_TRACE_PROCESSOR")
    if not binary:
        pytest.skip("set AIOCUBIE_TRACE_PROCESSOR to a trace_processor_shell binary to run Perfetto's importer")
    trace_processor = pytest.importorskip("perfetto.trace_processor")
    history = await _history(sim)
    path = history.to_perfetto(tmp_path / "trace.json")
    config = trace_processor.TraceProcessorConfig(bin_path=binary)
    with trace_processor.TraceProcessor(trace=str(path), config=config) as tp:
        threads = {row.name for row in tp.query("select name from thread")}
        slices = {row.name for row in tp.query("select name from slice")}
        errors = list(tp.query("select name, value from stats where severity = 'error' and value > 0"))
    assert {"group solve", "group load", "a", "b", "c"} <= threads
    assert {"batch", "request", "allocate", "x", "p", "y"} <= slices
    assert not errors, [(row.name, row.value) for row in errors]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_catapults_trace_viewer_imports_the_trace(sim: SimulatorBackend, tmp_path: Path) -> None:
    """Optional: needs node and a catapult checkout ($AIOCUBIE_CATAPULT): the importer chrome://tracing runs
    reads every track, with no warning (shown to warn on an E with no B, as the validator refuses)."""
    catapult, node = os.environ.get("AIOCUBIE_CATAPULT"), shutil.which("node")
    if not catapult or node is None:
        pytest.skip("set AIOCUBIE_CATAPULT to a catapult checkout (and install node) to run its trace importer")
    script = Path(__file__).resolve().parent.parent / "scripts" / "catapult_import.js"

    def imported(trace: dict[str, Any]) -> dict[str, Any]:
        (tmp_path / "t.json").write_text(json.dumps(trace))
        done = subprocess.run([node, str(script), catapult, str(tmp_path / "t.json")], capture_output=True, check=True)
        return dict(json.loads(done.stdout))

    async with MemoryManager(sim, batch_window=0.005) as mgr:
        mgr.record_history()
        await _workload(mgr)
        part = Part()
        mgr.register(part, stream_group="walk", name="w")
        x = np.arange(TOTAL // 8, dtype=np.float64)  # the device: chunked
        async with mgr.request(part, walk_requests({"x": ArrayRequest.like(x)})) as response:
            async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"x": x}, depth=2):
                chunk.device["x"][...] += 1
        history = mgr.history()
    trace = json.loads(history.to_perfetto(tmp_path / "trace.json").read_text())
    got = imported(trace)
    assert got["warnings"] == []
    assert {f"aiocubie: stream groups/group {g}" for g in ("solve", "load", "walk")} <= set(got["threads"])
    assert {f"aiocubie: instances/{name}" for name in ("a", "b", "c", "w", "w: walks")} <= set(got["threads"])
    assert {"batch", "request", "queued", "planned", "allocated", "in flight", "ready", "x", "p", "y"} <= set(
        got["slices"]
    )
    assert {"chunk 0", "chunk 1", "host->device", "body", "device->host"} <= set(got["slices"])
    broken = {**trace, "traceEvents": [*trace["traceEvents"], {"ph": "E", "name": "x", "ts": 1, "pid": 2, "tid": 1}]}
    assert imported(broken)["warnings"]
