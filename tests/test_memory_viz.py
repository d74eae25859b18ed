"""The history as a snapshot for torch's memory viewer (History.to_memory_viz): the fields torch's
_snapshot() writes, segments its tools can lay out, a pickle its viewer's own unpickler reads, and
(where torch is installed) torch.cuda._memory_viz's summaries and pages built from it."""

from __future__ import annotations

import pickle
import pickletools
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from simkit import Part, vec

from aiocubie import MemoryManager
from aiocubie._memory_viz import snapshot
from aiocubie.errors import ConfigurationError
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import History

pytestmark = pytest.mark.anyio

#: The opcodes MemoryViz.js's unpickler knows (pytorch torch/utils/viz/MemoryViz.js, `unpickle`).
VIEWER_OPCODES = {
    "PROTO", "FRAME", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET", "BININT",
    "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "BINPUT",
    "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT", "SHORT_BINUNICODE", "BINUNICODE", "STOP", "EMPTY_TUPLE",
    "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT",
}  # fmt: skip
SEGMENT = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
           "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}  # fmt: skip
BLOCK = {"address", "size", "requested_size", "state", "frames"}
FRAME = {"filename", "line", "name"}


async def _history(sim: SimulatorBackend, *, stacks: bool = False) -> tuple[History, int]:
    """Two groups; ``a``'s "x" freed and asked again (its gap reused), ``b``'s "y" held at the end."""
    async with MemoryManager(sim) as mgr:
        mgr.record_history(stacks=stacks)
        a, b = Part(), Part()
        mgr.register(a, stream_group="solve", name="a")
        mgr.register(b, stream_group="load", name="b")
        first = await mgr.request(a, {"x": vec(1000), "p": vec(10, unchunkable=True)})
        mgr.free("x", a)
        again = await mgr.request(a, {"x": vec(500)})
        kept = await mgr.request(b, {"y": vec(300)})
        history = mgr.history()  # before the end: b's "y" and a's arrays are held
        mgr.release(first)
        mgr.release(again)
        mgr.release(kept)
    return history, 300 * 8


def _check_snapshot(data: dict[str, Any]) -> None:
    """The fields torch writes; blocks tiling each segment; every trace entry on a segment."""
    assert set(data) == {"segments", "device_traces"} and len(data["device_traces"]) == 1
    for segment in data["segments"]:
        assert set(segment) == SEGMENT
        at = segment["address"]
        for block in segment["blocks"]:
            assert set(block) == BLOCK and block["address"] == at and block["size"] > 0
            assert block["state"] in ("active_allocated", "inactive")
            assert all(set(frame) == FRAME for frame in block["frames"])
            at += block["size"]
        assert at == segment["address"] + segment["total_size"]
        held = sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
        assert segment["allocated_size"] == segment["active_size"] == held
    spans = [(s["address"], s["address"] + s["total_size"]) for s in data["segments"]]
    live: dict[int, int] = {}
    for entry in data["device_traces"][0]:
        assert {"action", "addr", "size", "stream", "frames", "time_us"} <= set(entry)
        if entry["action"] == "segment_alloc":
            assert (entry["addr"], entry["addr"] + entry["size"]) in spans
            continue
        assert any(lo <= entry["addr"] and entry["addr"] + entry["size"] <= hi for lo, hi in spans), entry
        if entry["action"] == "alloc":
            assert all(not (a < entry["addr"] + entry["size"] and entry["addr"] < a + n) for a, n in live.items())
            live[entry["addr"]] = entry["size"]
        elif entry["action"] == "free_completed":
            assert live.pop(entry["addr"]) == entry["size"]
    at_end = {b["address"]: b["size"] for s in data["segments"] for b in s["blocks"] if b["state"] != "inactive"}
    assert at_end == live


async def test_the_snapshot_has_torchs_fields_and_its_segments_add_up(sim: SimulatorBackend) -> None:
    history, kept = await _history(sim)
    data = snapshot(history.events)
    _check_snapshot(data)
    solve, load = data["segments"]
    assert (solve["stream"], load["stream"]) == (1, 2)  # a stream number per group
    (y,) = [b for b in load["blocks"] if b["state"] == "active_allocated"]
    assert y["size"] == y["requested_size"] == kept
    assert y["frames"][0] == {"filename": "stream group load", "line": 0, "name": "b: y"}
    allocs = [e for e in data["device_traces"][0] if e["action"] == "alloc"]
    assert [e["frames"][0]["name"] for e in allocs] == ["a: x", "a: p", "a: x", "b: y"]
    assert allocs[2]["addr"] == allocs[0]["addr"]  # the freed gap is used again (first fit)


async def test_stacks_become_frames_innermost_first(sim: SimulatorBackend) -> None:
    history, _ = await _history(sim, stacks=True)
    alloc = next(e for e in snapshot(history.events)["device_traces"][0] if e["action"] == "alloc")
    assert alloc["frames"][0]["name"] == "a: x"
    assert alloc["frames"][1]["filename"] == __file__ and alloc["frames"][1]["name"] == "_history"


async def test_the_pickle_uses_only_what_the_viewers_unpickler_reads(sim: SimulatorBackend, tmp_path: Path) -> None:
    history, _ = await _history(sim)
    path = history.to_memory_viz(tmp_path / "snapshot.pickle")
    raw = path.read_bytes()
    assert {op.name for op, _, _ in pickletools.genops(raw)} <= VIEWER_OPCODES
    assert pickle.loads(raw) == snapshot(history.events)
    with pytest.raises(ConfigurationError, match="pass its path"):
        history.to_memory_viz(None)  # type: ignore[arg-type]


def test_a_context_reset_frees_everything() -> None:
    from aiocubie.stats import HistoryEvent

    events = [
        HistoryEvent("allocate", 1.0, "g", "i", "x", 100, "device", 1, 10, 100, 100),
        HistoryEvent("reset", 2.0, detail="context: allocator swapped"),
        HistoryEvent("allocate", 3.0, "g", "i", "x", 40, "device", 1, 10, 40, 40),
    ]
    data = snapshot(events)
    _check_snapshot(data)
    actions = [e["action"] for e in data["device_traces"][0]]
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed", "alloc"]


def _check_in_torchs_viewer(memory_viz: ModuleType, data: dict[str, Any], kept: int) -> None:
    """torch.cuda._memory_viz's text summaries and HTML pages, built from ``data``."""
    summary = memory_viz.segsum(data)  # asserts that each segment's blocks add up
    assert "segments: 2" in summary
    text = memory_viz.trace(data)
    assert "cudaMalloc" in text and f"{kept / 1024:.1f}KiB" in text
    for page in (memory_viz.trace_plot(data), memory_viz.segment_plot(data)):
        assert page.lstrip().startswith("<!DOCTYPE html>") and "snapshot.pickle" in page


async def test_torchs_memory_viz_reads_it(sim: SimulatorBackend) -> None:
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz

    history, kept = await _history(sim)
    _check_in_torchs_viewer(_memory_viz, snapshot(history.events), kept)
