"""Observability: the allocation history (contents, bounds, JSON, pictures, CLI), the memory summary,
peak resets, pool facts, Snapshot.to_dict, DEBUG logs and the environment variables."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import anyio
import numpy as np
import pytest
from simkit import TOTAL, ByHand, Part, vec

import aiocubie as ac
from aiocubie import ArrayRequest, LimitMode, MemoryKind, MemoryManager
from aiocubie.__main__ import main as cli
from aiocubie._history import HistoryRecorder
from aiocubie._ledger import Allocation, Ledger
from aiocubie._planner import ChunkPlan
from aiocubie._plot import render, to_html
from aiocubie.errors import AiocubieWarning, ConfigurationError, UnknownAllocatorError
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import EventKind, History

pytestmark = pytest.mark.anyio


async def _work(mgr: MemoryManager, sim: SimulatorBackend) -> tuple[Part, Part]:
    """Two groups: one whole batch, one chunked batch; everything released."""
    a, b = Part(), Part()
    mgr.register(a, stream_group="solve", name="a")
    mgr.register(b, stream_group="load", name="b")
    async with mgr.request(a, {"x": vec(1000), "p": vec(10, unchunkable=True)}):
        pass
    async with mgr.request(b, {"y": vec(TOTAL // 8 * 3)}) as big:  # over free: chunked
        assert big.chunks > 1
    return a, b


async def test_history_records_plans_allocations_and_releases(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        mgr.record_history()
        await _work(mgr, sim)
        history = mgr.history()
    kinds = [e.kind for e in history.events]
    assert kinds == [
        EventKind.PLAN,
        EventKind.ALLOCATE,
        EventKind.ALLOCATE,
        EventKind.QUEUED,  # its wait in the queue ended: allocated
        EventKind.READY,  # the device reached its event
        EventKind.RELEASE,
        EventKind.RELEASE,
        EventKind.PLAN,
        EventKind.ALLOCATE,
        EventKind.QUEUED,
        EventKind.READY,
        EventKind.RELEASE,
    ]
    queued, ready = history.events[3:5]
    assert (queued.group, queued.instance, queued.priority) == (ready.group, ready.instance, ready.priority)
    assert (queued.instance, queued.priority) == ("a", 0) and queued.since is not None
    assert queued.since <= history.events[0].time <= queued.time <= ready.time
    memory = [e for e in history.events if e.kind not in (EventKind.QUEUED, EventKind.READY)]
    plan, x, p = memory[:3]
    assert (plan.group, plan.chunks, plan.chunk_length, plan.nbytes) == ("solve", 1, 1000, 8080)
    assert (x.group, x.instance, x.label, x.nbytes, x.memory_kind) == ("solve", "a", "x", 8000, "device")
    assert (x.group_live, p.group_live, p.instance_live) == (8000, 8080, 8080)
    assert [e.group_live for e in memory[3:5]] == [80, 0]  # released in the order allocated
    big_plan, big = memory[5:7]
    assert big_plan.chunks > 1 and big.chunks == big_plan.chunks and big.chunk_length == big_plan.chunk_length
    assert big.nbytes == big.chunk_length * 8 and big.stack is None
    assert history.events == tuple(sorted(history.events, key=lambda e: e.time))
    assert history.series("group")["load"][1] == [big.nbytes, 0]
    assert history.series("instance")["a"][1][-1] == 0
    assert math.isclose(history.wall_base + history.events[0].time, history.wall_base + plan.time)


async def test_history_is_a_bounded_ring_and_stops_when_asked(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        with pytest.raises(ConfigurationError, match="record_history"):
            mgr.history()
        with pytest.raises(ConfigurationError, match="max_entries"):
            mgr.record_history(max_entries=0)
        mgr.record_history(max_entries=3)
        parts = await _work(mgr, sim)  # registered: a release whose allocation left the ring is named after its key
        history = mgr.history()
        assert len(history.events) == 3 and history.dropped == 9 and history.max_entries == 3
        assert [e.kind for e in history.events] == [EventKind.QUEUED, EventKind.READY, EventKind.RELEASE]
        mgr.record_history(False)
        part = Part()
        mgr.register(part)
        async with mgr.request(part, {"x": vec(10)}):
            pass
        assert mgr.history() == history  # what was recorded stays; nothing more is
        assert {e.instance for e in history.events} == {"b"} and parts


async def test_record_history_refuses_a_ring_it_cannot_allocate() -> None:
    async with ac.MemoryManager("simulator") as mgr:
        for size in (2**62, 10_000_001, 0):
            with pytest.raises(ConfigurationError, match="from 1 to 10,000,000"):
                mgr.record_history(max_entries=size)


async def test_history_stacks_name_the_requesting_code(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        mgr.record_history(stacks=True)
        part = Part()
        mgr.register(part)
        async with mgr.request(part, {"x": vec(10)}):  # served inline: in this task
            pass
        plan, alloc, queued, ready, release = mgr.history().events
    assert plan.stack is not None and alloc.stack is not None and release.stack is None
    assert queued.kind is EventKind.QUEUED and ready.kind is EventKind.READY
    assert any("test_history_stacks_name_the_requesting_code" in frame for frame in alloc.stack)
    assert not any("/aiocubie/_" in frame for frame in alloc.stack)


async def test_history_marks_failures_resets_and_group_moves(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, stream_group="g", name="p")
        held = await mgr.request(part, {"x": vec(100)})  # before recording: the totals start from it
        mgr.record_history()
        mgr.reset_peaks()
        sim.faults.inject("allocate")
        with pytest.raises(Exception, match="injected fault"):
            await mgr.request(part, {"y": vec(10)})
        mgr.groups.move(part, "h")
        mgr.release(held)
        with pytest.warns(AiocubieWarning, match="resets the device context"):
            mgr.pool.set_allocator("cupy")
        events = mgr.history().events
    assert [e.kind for e in events] == [
        EventKind.RESET,
        EventKind.PLAN,
        EventKind.FAILURE,
        EventKind.REGROUP,
        EventKind.REGROUP,
        EventKind.RELEASE,
        EventKind.RESET,
    ]
    assert events[0].detail == "peak stats (all)"
    assert events[2].group == "g" and "injected fault" in events[2].detail and events[2].nbytes == 80
    moves = {(e.group, e.instance, e.nbytes, e.group_live, e.detail) for e in events[3:5]}
    assert moves == {("g", "p", 800, 0, "moved to h"), ("h", "p", 800, 800, "moved from g")}
    assert (events[5].group, events[5].group_live, events[5].instance_live) == ("h", 0, 0)
    assert events[6].detail.startswith("context")


async def test_history_series_follow_a_member_into_its_new_group() -> None:
    async with ac.MemoryManager("simulator") as mgr:
        mgr.record_history()
        component = Part()
        mgr.register(component, stream_group="a", name="c")
        response = await mgr.request(component, {"x": ArrayRequest((1000,), np.float32)})
        mgr.groups.move(component, "b")
        await anyio.sleep(0)
        mgr.release(response)
        series = {group: values for group, (_times, values) in mgr.history().series().items()}
    assert series == {"a": [4000, 0], "b": [4000, 0]}  # a gives the bytes up at the move, b holds them until release


async def test_history_json_round_trip_and_refusals(sim: SimulatorBackend, tmp_path: Path) -> None:
    async with MemoryManager(sim) as mgr:
        mgr.record_history(stacks=True)
        await _work(mgr, sim)
        history = mgr.history()
    path = tmp_path / "h.json"
    history.to_json(path)
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["events"][0]["kind"] == "plan" and data["dropped"] == 0
    assert History.load(path) == history
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match="is not JSON"):
        History.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": 9}')
    with pytest.raises(ConfigurationError, match="not an aiocubie history of format 1"):
        History.load(tmp_path / "other.json")
    with pytest.raises(ConfigurationError, match="cannot read"):
        History.load(tmp_path / "missing.json")


async def test_history_pictures_html_and_matplotlib(sim: SimulatorBackend, tmp_path: Path) -> None:
    async with MemoryManager(sim) as mgr:
        mgr.record_history()
        await _work(mgr, sim)
        history = mgr.history()
    page = to_html(history)
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 2
    assert "<script" not in page and "http://www.w3.org/2000/svg" in page and "https://" not in page
    for name in ("solve", "load", "a", "b", "plan, group solve: 1 chunk(s) of 1000 runs"):
        assert name in page
    assert render(history, tmp_path / "h.html").read_text() == page
    with pytest.raises(ConfigurationError, match="no allocations"):
        to_html(History((), 0.0))
    pytest.importorskip("matplotlib")
    png = render(history, tmp_path / "h.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_a_picture_without_matplotlib_says_what_to_install(
    sim: SimulatorBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with MemoryManager(sim) as mgr:
        mgr.record_history()
        await _work(mgr, sim)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    with pytest.raises(ConfigurationError, match=r"aiocubie\[plot\]"):
        render(mgr.history(), tmp_path / "h.png")


async def test_cli_history_verb(sim: SimulatorBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with MemoryManager(sim) as mgr:
        mgr.record_history()
        await _work(mgr, sim)
        mgr.history().to_json(tmp_path / "h.json")
    assert cli(["history", str(tmp_path / "h.json")]) == 0
    assert "12 events (0 dropped) drawn in" in capsys.readouterr().out
    assert (tmp_path / "h.html").read_text().startswith("<!DOCTYPE html>")
    assert cli(["history", str(tmp_path / "h.json"), "--out", str(tmp_path / "page.htm")]) == 0
    assert (tmp_path / "page.htm").exists()
    assert cli(["history", str(tmp_path / "none.json")]) == 1
    assert "cannot read the history" in capsys.readouterr().err


async def test_memory_summary_reads_at_a_glance(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", allocator="cupy") as mgr:
        a, _ = await _work(mgr, sim)
        kept = await mgr.request(a, {"x": vec(200_000 // 8)})
        text = mgr.summary()
        mgr.release(kept)
    lines = text.splitlines()
    assert lines[0].startswith("device: ") and "976.6 KiB" in lines[0]  # TOTAL in KiB
    assert lines[1].startswith("pool: ") and "largest cached block" in lines[1]
    header = next(line for line in lines if line.startswith("group"))
    for column in ("live", "peak", "cap", "requests", "batches", "chunks", "wait p50/p99", "ready p50/p99"):
        assert column in header
    row = next(line for line in lines if line.startswith("solve "))
    assert "195.3 KiB" in row  # live: the 200 kB kept
    assert " µs" in row or " ms" in row
    assert any(line.startswith("a ") for line in lines) and any(line.startswith("b ") for line in lines)
    assert lines[-1].startswith("out of memory: 0 times")


async def test_reset_peak_stats_scopes(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        a, b = await _work(mgr, sim)
        held = await mgr.request(a, {"x": vec(100)})
        stats = mgr.stats()
        assert stats.groups["load"].peak_bytes > 800 and stats.instances["a"].peak_bytes == 8080

        mgr.reset_peaks(group="load")
        stats = mgr.stats()
        assert stats.groups["load"].peak_bytes == 0 and stats.instances["b"].peak_bytes > 0
        assert stats.groups["solve"].peak_bytes == 8080

        mgr.reset_peaks(instance=a)
        stats = mgr.stats()
        assert stats.instances["a"].peak_bytes == 800 and stats.groups["solve"].peak_bytes == 8080

        mgr.reset_peaks()
        stats = mgr.stats()
        assert stats.peak_bytes == stats.live_bytes == 800
        assert stats.groups["solve"].peak_bytes == 800 and stats.instances["b"].peak_bytes == 0

        mgr.unregister(b)  # a departed instance's kept peak is reset too
        async with mgr.request(a, {"x": vec(1000)}):
            pass
        mgr.reset_peaks()
        assert mgr.stats().instances["b"].peak_bytes == 0 and mgr.stats().instances["a"].peak_bytes == 800
        with pytest.raises(Exception, match="no stream group 'nope'"):
            mgr.reset_peaks(group="nope")
        mgr.release(held)


async def test_snapshot_to_dict_is_json_with_wall_clock_and_units(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active") as mgr:
        parts = await _work(mgr, sim)  # held: a collected instance leaves its group
        snapshot = mgr.stats()
        del parts
    data = json.loads(json.dumps(snapshot.to_dict()))
    assert data["total"] == TOTAL and data["wall_time"] == snapshot.wall_time > 1.6e9  # seconds since the epoch
    assert data["groups"]["solve"]["requests"] == 1 and data["groups"]["solve"]["over_cap"] is False
    assert data["groups"]["solve"]["cap_bytes"] > 0
    assert data["instances"]["a"]["queue_wait"]["p50"] >= 0
    assert set(data["pool"]) == {"held", "in_use", "largest_free"} and data["recovery"]["out_of_memory"] == 0


def test_simulator_pool_facts_show_cached_blocks() -> None:
    sim = SimulatorBackend(total=TOTAL)
    stream = sim.device.create_stream()
    u8 = np.dtype(np.uint8)
    mem = ByHand(sim)
    a = mem.allocate((1000,), u8, MemoryKind.DEVICE, stream)
    assert mem.resource.pool_facts() == type(mem.resource.pool_facts())(1000, 1000, 0)  # driver model: no pool
    mem.free(a)
    assert mem.resource.pool_facts().in_use == 1000  # given back, but an array over it is alive (as on a GPU)
    del a
    assert mem.resource.pool_facts().held == 0 and mem.resource.release_cached() == 0
    pool = ByHand(sim, sim.device.create_resource("cupy"))
    arrays = [pool.allocate((n,), u8, MemoryKind.DEVICE, stream) for n in (300, 500)]
    while arrays:
        pool.free(arrays.pop())
    facts = pool.resource.pool_facts()
    assert (facts.held, facts.in_use, facts.cached, facts.largest_free) == (800, 0, 800, 500)
    b = pool.allocate((200,), u8, MemoryKind.DEVICE, stream)  # from the 300-byte block: split, the rest stays cached
    facts = pool.resource.pool_facts()
    assert (facts.held, facts.in_use, facts.largest_free) == (800, 200, 500) and sorted(sim.cached) == [100, 500]
    assert sim.device.memory_info().free == TOTAL - 800  # as the driver says: cached blocks are held
    assert sim.used == 200  # in use by arrays
    assert pool.resource.release_cached() == 600 and pool.resource.pool_facts().held == 200
    assert sim.device.memory_info().free == TOTAL - 200
    pool.free(b)
    sim.close()


async def test_the_manager_counts_cached_pool_blocks_as_free() -> None:
    async with MemoryManager(SimulatorBackend(total=TOTAL, allocator="cupy")) as mgr:
        part = Part()
        mgr.register(part)
        async with mgr.request(part, {"x": vec(1000)}):
            assert mgr.pool.memory_info().free == TOTAL - 8000
        assert mgr.stats().pool.cached == 8000 and mgr.backend.device.memory_info().free == TOTAL - 8000
        assert mgr.pool.memory_info().free == mgr.stats().free == TOTAL  # the pool serves requests from them


async def test_debug_logs_plans_and_allocations(sim: SimulatorBackend, caplog: pytest.LogCaptureFixture) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, stream_group="g")
        with caplog.at_level(logging.INFO, logger="aiocubie"):
            async with mgr.request(part, {"x": vec(10)}):
                pass
        assert not [r for r in caplog.records if r.levelno == logging.DEBUG]
        with caplog.at_level(logging.DEBUG, logger="aiocubie"):
            async with mgr.request(part, {"x": vec(10)}):
                pass
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert "group 'g': plan for 1 request(s) of 10 runs: 1 chunk(s) of 10 runs, 80 bytes of" in messages[0]
    assert "group 'g': allocated 1 array(s), 80 bytes" in messages[1]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_environment_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIOCUBIE_MODE", "active")
    monkeypatch.setenv("AIOCUBIE_BACKEND", "simulator")
    monkeypatch.setenv("AIOCUBIE_ALLOCATOR", "cupy")
    monkeypatch.setenv("AIOCUBIE_HISTORY", "1")
    mgr = MemoryManager()
    assert mgr.budget.mode is LimitMode.ACTIVE and mgr.backend.name == "simulator" and mgr.pool.allocator == "cupy"
    assert mgr.history().events == ()
    mgr.close()
    explicit = MemoryManager(backend=SimulatorBackend(TOTAL), mode="passive", allocator="default")
    assert explicit.budget.mode is LimitMode.PASSIVE and explicit.pool.allocator == "driver"  # arguments win
    monkeypatch.setenv("AIOCUBIE_HISTORY", str(tmp_path / "oom.json"))
    assert MemoryManager(SimulatorBackend(TOTAL)).history().events == ()
    for variable, value, error in (
        ("AIOCUBIE_MODE", "busy", ConfigurationError),
        ("AIOCUBIE_BACKEND", "tpu", ConfigurationError),
        ("AIOCUBIE_ALLOCATOR", "jemalloc", UnknownAllocatorError),
        ("AIOCUBIE_HISTORY", "yes", ConfigurationError),
    ):
        with monkeypatch.context() as env:
            env.setenv(variable, value)
            with pytest.raises(error, match=f"environment variable {variable}={value!r}"):
                MemoryManager()
    await anyio.lowlevel.checkpoint()


def test_recorder_works_out_live_bytes_across_moves_resets_and_reused_keys() -> None:
    ledger = Ledger()
    names = {1: "first"}
    recorder = HistoryRecorder(5, ledger=ledger, names=names.__getitem__)
    plan = ChunkPlan(1, 1, 1, 100, 10, 10)

    def add(key: int, group: str, vram: int) -> list[Allocation]:
        allocs = [Allocation(None, "x", key, group, MemoryKind.DEVICE, vram)]
        owner = object()
        ledger.add(owner, allocs, vram)
        recorder.allocated([allocs], plan)
        return allocs

    add(1, "g", 10)  # dropped from the ring of 5, yet what follows knows it was there
    second = add(1, "g", 5)
    recorder.regrouped(1, "g", "h", 15)
    ledger.regroup(1, "h")
    recorder.released(ledger.pop_where(lambda a: a is second[0]))
    recorder.reset("context reset", context=True)
    ledger.pop_where(lambda a: True)
    ledger.forget(1)
    names[1] = "second"  # the key is reused by a new instance
    add(1, "g", 7)
    events = recorder.history().events
    assert recorder.history().dropped == 1 and len(events) == 6  # the regroup row: an event for each group
    allocated, moved_from, moved_to, release, reset, allocate = events
    assert (allocated.group, allocated.instance, allocated.group_live, allocated.nbytes) == ("g", "first", 15, 5)
    assert (moved_from.group, moved_from.instance, moved_from.group_live, moved_from.nbytes) == ("g", "first", 0, 15)
    assert (moved_to.group, moved_to.instance, moved_to.group_live, moved_to.detail) == (
        "h",
        "first",
        15,
        "moved from g",
    )
    assert (release.group, release.instance, release.group_live, release.instance_live) == ("h", "first", 10, 10)
    assert reset.kind is EventKind.RESET and reset.detail == "context: context reset"
    assert (allocate.group, allocate.instance, allocate.group_live, allocate.instance_live) == ("g", "second", 7, 7)


# -- statistics(): the manager's own state, read-only -------------------------------------------
@pytest.mark.anyio
async def test_statistics_is_a_frozen_view_of_requests_members_and_arrays() -> None:
    import attrs

    from aiocubie.stats import GroupStatistics, MemberStatistics

    sim = SimulatorBackend(total=TOTAL)
    mgr = MemoryManager(sim, batch_window=60)  # a batch waits for every member of its group
    a, b, c = Part(), Part(), Part()
    mgr.register(a, name="a", proportion=0.2)
    mgr.register(b, name="b")
    mgr.register(c, name="c", stream_group="solo")
    before = mgr.statistics()
    assert not before.running and before.groups == {} and before.pending == before.allocations == 0
    assert before.members == {
        "a": MemberStatistics("default", True),
        "b": MemberStatistics("default", False),
        "c": MemberStatistics("solo", False),
    }
    assert before.tables["members"] == 3 and before.tables["groups"] == 2
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        before.running = True  # type: ignore[misc]
    held = mgr.allocate(c, {"array": vec(10)}).arrays["array"]
    assert mgr.statistics().allocations == 1 and before.allocations == 0  # a snapshot does not follow
    async with mgr:

        async def ask() -> None:
            mgr.release(await mgr.request(a, {"x": vec(10)}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)  # b has not asked: the batch stays open
            with anyio.fail_after(10):
                while mgr.statistics().groups["default"].queued != 1:
                    await anyio.sleep(0.001)
            stats = mgr.statistics()
            assert stats.running and stats.pending == 1
            assert stats.groups == {"default": GroupStatistics(queued=1, by_priority={0: 1}), "solo": GroupStatistics()}
            mgr.groups.flush()
        assert mgr.statistics().pending == 0
    assert held is not None and mgr.statistics().allocations == 0  # leaving `async with` frees all
    mgr.close()
