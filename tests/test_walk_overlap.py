"""The overlapped walk: bit-identical to the serial walk, overlapping on the simulator's engines,
clean after cancellation, errors and faults, and budgeted by the planner (issue 12).

Runs on the simulator under asyncio and trio. Overlap and order are read from the simulator's
timeline, never from wall time.
"""

from __future__ import annotations

import contextlib
import gc
import math
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simkit import needs_numba

from aiocubie import ArrayRequest, MemoryManager, walk_chunks, walk_requests
from aiocubie._backends._sim import host_data
from aiocubie._planner import plan_chunks
from aiocubie.errors import AiocubieError, BackendError, InvalidRequestError
from aiocubie.planning import plan_batch
from aiocubie.simulator import Engines, SimulatorBackend

RUNS = 11
SHAPES = {0: (RUNS, 3), 1: (2, RUNS, 3), -1: (2, 3, RUNS)}
DTYPES = [np.float32, np.float64, np.int16, np.uint8, np.complex64]


def _requests(axis: int, dtype: Any, kind: str = "device") -> dict[str, ArrayRequest]:
    shape = SHAPES[axis]
    return {
        "x": ArrayRequest(shape, dtype, kind, chunk_axis=axis),
        "z": ArrayRequest(shape, dtype, kind, chunk_axis=axis),  # in and out: updated in place
        "y": ArrayRequest(shape, dtype, kind, chunk_axis=axis),
        "p": ArrayRequest((4,), dtype, kind, unchunkable=True),
        "total": ArrayRequest((1,), np.float64, unchunkable=True, zero=True),
    }


def _budget(requests: dict[str, ArrayRequest], depth: int, max_chunk: int) -> int:
    """Simulated memory that fits ``max_chunk`` runs of ``depth`` buffers (half a run spare)."""
    per_run = sum(r.bytes_per_run for r in requests.values() if r.kind.uses_vram)
    whole = sum(r.nbytes for r in requests.values() if r.unchunkable)
    return whole + depth * per_run * max_chunk + per_run // 2


def _data(axis: int, dtype: Any, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = SHAPES[axis]
    if np.dtype(dtype).kind == "c":
        x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    elif np.dtype(dtype).kind == "f":
        x = rng.standard_normal(shape).astype(dtype)
    else:
        x = rng.integers(0, 50, shape).astype(dtype)
    return {"x": x, "z": x[::-1].copy() if axis else x.copy() + 1, "p": np.arange(1, 5).astype(dtype)}


async def _walk(
    axis: int,
    dtype: Any,
    depth: int,
    max_chunk: int,
    *,
    kind: str = "device",
    pinned: bool = False,
    array_type: str = "cupy",
) -> tuple[dict[str, np.ndarray], int, SimulatorBackend, MemoryManager]:
    """Walk the data at ``depth``; the body is y = x * 3 + sum(p), z = z - x, total += sum(x)."""
    requests = _requests(axis, dtype, kind)
    sim = SimulatorBackend(_budget(requests, depth, max_chunk), array_type=array_type)
    data = _data(axis, dtype)
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        host = {}
        for label in ("x", "z", "p"):
            host[label] = (
                mgr.host.array(data[label].shape, data[label].dtype, "pinned", like=data[label])
                if pinned
                else data[label].copy()
            )
        shape = SHAPES[axis]
        host["y"] = mgr.host.array(shape, dtype, "pinned") if pinned else np.zeros(shape, dtype)
        host["total"] = np.zeros(1)
        async with mgr.request(solver, walk_requests(requests, depth)) as response:
            chunks = response.chunks
            async for chunk in walk_chunks(
                response,
                inputs={k: host[k] for k in ("x", "z", "p")},
                outputs={k: host[k] for k in ("y", "z", "total")},
                depth=depth,
            ):
                d = chunk.device
                if array_type == "cupy":
                    d["y"][...] = d["x"] * 3 + d["p"].sum()
                    d["z"][...] = d["z"] - d["x"]
                    d["total"][0] += float(abs(d["x"].sum()))
                else:
                    x = d["x"].copy_to_host()
                    d["y"].copy_to_device(x * 3 + d["p"].copy_to_host().sum())
                    d["z"].copy_to_device(d["z"].copy_to_host() - x)
                    d["total"].copy_to_device(d["total"].copy_to_host() + float(abs(x.sum())))
        stats = mgr.stats()
        assert stats.pinned.in_use == (stats.pinned.in_use if pinned else 0)
    return host, chunks, sim, mgr


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    for label in ("y", "z", "total"):
        assert a[label].tobytes() == b[label].tobytes(), label  # bit for bit


@pytest.mark.anyio
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pinned", [False, True])
async def test_every_depth_is_bit_identical_to_the_serial_walk(axis: int, dtype: Any, pinned: bool) -> None:
    serial, chunks, _, _ = await _walk(axis, dtype, 1, 2, pinned=pinned)
    assert chunks == math.ceil(RUNS / 2)
    for depth in (2, 3, 4):
        overlapped, chunks, sim, mgr = await _walk(axis, dtype, depth, 2, pinned=pinned)
        assert chunks == math.ceil(RUNS / 2)
        _same(overlapped, serial)
        assert sim.used == 0
        assert mgr.backend.device.pinned_pool.in_use == 0


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["device", "managed", "mapped", "pinned"])
@pytest.mark.parametrize("array_type", ["cupy", pytest.param("numba", marks=needs_numba)])
async def test_every_kind_and_array_type(kind: str, array_type: str) -> None:
    if kind == "pinned" and array_type == "numba":
        pytest.skip("pinned device-side arrays are numpy arrays: the numba body does not apply")
    axis = 0 if array_type == "numba" else 1  # the numba body copies whole (contiguous) chunks
    serial, _, _, _ = await _walk(axis, np.float32, 1, 2, kind=kind, array_type=array_type)
    for depth in (2, 3):
        overlapped, _, _, _ = await _walk(axis, np.float32, depth, 2, kind=kind, array_type=array_type)
        _same(overlapped, serial)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    axis=st.sampled_from([0, 1, -1]),
    dtype=st.sampled_from(DTYPES),
    depth=st.integers(1, 5),
    max_chunk=st.integers(1, RUNS),
    pinned=st.booleans(),
)
def test_bit_identical_property(axis: int, dtype: Any, depth: int, max_chunk: int, pinned: bool) -> None:
    async def both() -> None:
        overlapped, chunks, _, _ = await _walk(axis, dtype, depth, max_chunk, pinned=pinned)
        serial, serial_chunks, _, _ = await _walk(axis, dtype, 1, math.ceil(RUNS / chunks), pinned=pinned)
        assert serial_chunks == chunks  # the same chunks, so the same sums in the same order
        _same(overlapped, serial)

    anyio.run(both)


# -- overlap and order, from the simulator's timeline ------------------------------------------

ENGINES = Engines(h2d_bandwidth=1e6, d2h_bandwidth=1e6, copy_latency=0.0)  # 1 MB/s: 20 kB take 20 ms


async def _timed_walk(
    depth: int, *, kernel: float = 0.03, chunks: int = 5, in_place: bool = False
) -> tuple[list[Any], Any, np.ndarray]:
    runs, width = chunks * 4, 5000  # a chunk of x is 4 x 5000 bytes = 20 kB: 20 ms each way
    requests = {
        "x": ArrayRequest((runs, width), np.uint8),
        "y": ArrayRequest((runs, width), np.uint8),
    }
    sim = SimulatorBackend(1 << 30, engines=ENGINES)
    x = np.arange(runs * width, dtype=np.uint8).reshape(runs, width)
    y = np.zeros_like(x)
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        per_run = 2 * width
        mgr.budget.move_to_manual(solver, (depth * per_run * 4 + per_run // 2) / sim.total)
        mgr.budget.set_mode("active")
        async with mgr.request(solver, walk_requests(requests, depth)) as response:
            assert response.chunks == chunks
            inputs = {"x": x}
            outputs = {"x": x} if in_place else {"y": y}
            async for chunk in walk_chunks(response, inputs=inputs, outputs=outputs):
                dx, dy = host_data(chunk.device["x"]), host_data(chunk.device["y"])

                def work(dx: np.ndarray = dx, dy: np.ndarray = dy) -> None:
                    if in_place:
                        dx += 1
                    else:
                        np.add(dx, 1, out=dy)

                sim.launch(chunk.stream, work, duration=kernel, tag=("kernel", chunk.index))
    return list(sim.timeline), x, y


def _ops(timeline: list[Any]) -> dict[tuple[str, int], Any]:
    found = {}
    for entry in timeline:
        kind, index = entry.tag[0], entry.tag[1]
        found[(kind, index)] = entry
    return found


@pytest.mark.anyio
async def test_copies_of_neighbours_run_while_a_chunk_computes() -> None:
    # The simulated engines run on the wall clock, so a host stalled by a loaded machine can launch
    # a kernel late and miss an overlap the walk allowed. The ordering checks hold on every try; the
    # overlaps must show in one of three tries (a walk that serialises its copies fails all three).
    misses: list[str] = []
    for _ in range(3):
        timeline, x, y = await _timed_walk(2)
        np.testing.assert_array_equal(y, x + 1)
        ops = _ops(timeline)
        missed = []
        for i in range(5):
            kernel = ops[("kernel", i)]
            assert kernel.start >= ops[("in", i)].end  # its inputs were in
            assert ops[("out", i)].start >= kernel.end  # its outputs left after it
            if i + 1 < 5 and not ops[("in", i + 1)].overlaps(kernel):
                missed.append(f"chunk {i + 1}'s copy in did not overlap chunk {i}'s kernel")
            if i >= 1 and not ops[("out", i - 1)].overlaps(kernel):
                missed.append(f"chunk {i - 1}'s copy out did not overlap chunk {i}'s kernel")
        # one engine per direction: copies of one direction never overlap each other
        for direction in ("h2d", "d2h"):
            copies = sorted((e for e in timeline if e.engine == direction), key=lambda e: e.start)
            assert all(a.end <= b.start for a, b in zip(copies, copies[1:]))
        if not missed:
            return
        misses.append("; ".join(missed))
    pytest.fail("no try overlapped every neighbour's copies: " + " | ".join(misses))


@pytest.mark.anyio
async def test_the_serial_walk_overlaps_nothing() -> None:
    timeline, x, y = await _timed_walk(1)
    np.testing.assert_array_equal(y, x + 1)
    ordered = sorted(timeline, key=lambda e: e.start)
    assert all(a.end <= b.start for a, b in zip(ordered, ordered[1:]))


@pytest.mark.anyio
async def test_in_place_arrays_wait_for_their_copy_out_before_the_next_copy_in() -> None:
    timeline, x, _ = await _timed_walk(2, in_place=True)
    np.testing.assert_array_equal(x, (np.arange(x.size).reshape(x.shape) + 1).astype(np.uint8))
    ops = _ops(timeline)
    for i in range(2, 5):
        assert ops[("in", i)].start >= ops[("out", i - 2)].end  # same buffer: drained first


@pytest.mark.anyio
async def test_depth_three_overlaps_in_place_arrays_too() -> None:
    timeline, x, _ = await _timed_walk(3, in_place=True)
    np.testing.assert_array_equal(x, (np.arange(x.size).reshape(x.shape) + 1).astype(np.uint8))
    ops = _ops(timeline)
    assert any(ops[("in", i + 1)].overlaps(ops[("kernel", i)]) for i in range(4))


# -- cancellation, errors and faults -------------------------------------------------------------


def _idle(sim: SimulatorBackend) -> bool:
    # at most the item that completed the walk's last event may still be counting itself done
    return all(s.pending <= 1 for s in sim.device.streams)


async def _interrupted(
    how: str, at: int, depth: int = 2, *, closing: bool = True, seen: list[Any] | None = None
) -> tuple[SimulatorBackend, MemoryManager]:
    requests = _requests(0, np.float64)
    sim = SimulatorBackend(_budget(requests, depth, 2), engines=Engines(h2d_bandwidth=2e6, d2h_bandwidth=2e6))
    data = _data(0, np.float64)
    y = np.zeros(SHAPES[0])
    async with MemoryManager(sim, headroom=0.0) as mgr:
        if seen is not None:
            seen += [sim, mgr]
        solver = object()
        mgr.register(solver)
        if how == "fault":
            sim.faults.inject("copy", after=at)
        with anyio.CancelScope() as scope:
            async with mgr.request(solver, walk_requests(requests, depth)) as response:
                walk = walk_chunks(response, inputs={"x": data["x"], "z": data["z"]}, outputs={"y": y, "z": data["z"]})
                async with contextlib.aclosing(walk) if closing else contextlib.nullcontext(walk):
                    async for chunk in walk:
                        chunk.device["y"][...] = chunk.device["x"] * 2
                        if chunk.index == at and how == "cancel":
                            scope.cancel()
                            await anyio.sleep(0)
                        if chunk.index == at and how == "raise":
                            raise KeyError("body failed")
        assert _idle(sim)  # the walk waited for every copy it queued
        assert how == "cancel" or how == "fault", "the walk should have raised"
        return sim, mgr


def _assert_clean(sim: SimulatorBackend, mgr: MemoryManager) -> None:
    gc.collect()
    assert sim.used == 0
    assert mgr.backend.device.pinned_pool.in_use == 0
    assert mgr.stats().live_bytes == 0


@pytest.mark.anyio
@pytest.mark.parametrize("at", [0, 1, 3])
@pytest.mark.parametrize("depth", [2, 3])
async def test_cancelled_mid_walk_waits_for_its_copies_and_leaks_nothing(at: int, depth: int) -> None:
    sim, mgr = await _interrupted("cancel", at, depth)
    _assert_clean(sim, mgr)


@pytest.mark.anyio
@pytest.mark.parametrize("at", [0, 2, 4])
@pytest.mark.parametrize("closing", [True, False])
# unclosed (closing=False) on purpose: trio says so when it collects the walk
@pytest.mark.filterwarnings(
    "ignore:Async generator 'aiocubie._walks._chunks.walk_chunks' was garbage collected:ResourceWarning"
)
async def test_an_exception_in_the_body_leaks_nothing(at: int, closing: bool) -> None:
    seen: list[Any] = []
    with pytest.raises(KeyError, match="body failed"):
        await _interrupted("raise", at, closing=closing, seen=seen)
    sim, mgr = seen
    for _ in range(100):  # unclosed, the walk is closed by the loop's async-generator hooks
        gc.collect()
        if mgr.backend.device.pinned_pool.in_use == 0:
            break
        await anyio.sleep(0.01)
    _assert_clean(sim, mgr)
    assert _idle(sim)


@pytest.mark.anyio
@pytest.mark.parametrize("at", range(0, 16))
async def test_a_fault_at_any_copy_is_an_aiocubie_error(at: int) -> None:
    requests = _requests(0, np.float64)
    sim = SimulatorBackend(_budget(requests, 2, 2))
    data = _data(0, np.float64)
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        async with mgr.request(solver, walk_requests(requests, 2)) as response:
            sim.faults.inject("copy", after=at)
            try:
                async for chunk in walk_chunks(
                    response, inputs={"x": data["x"], "p": data["p"]}, outputs={"y": np.zeros(SHAPES[0])}
                ):
                    chunk.device["y"][...] = chunk.device["x"]
            except AiocubieError as exc:
                assert isinstance(exc, BackendError) and "injected fault" in str(exc)
                assert sim.faults.fired["copy"] == 1
            else:
                assert sim.faults.fired["copy"] == 0  # fewer copies than `at`
    _assert_clean(sim, mgr)


# -- budgets and depth ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    runs=st.integers(1, 10_000),
    fixed=st.integers(0, 10_000),
    per_run=st.integers(1, 1_000),
    depth=st.integers(1, 6),
    offered=st.integers(0, 10_000_000),
)
def test_a_deep_plan_fits_every_buffer_with_the_fewest_chunks(
    runs: int, fixed: int, per_run: int, depth: int, offered: int
) -> None:
    try:
        plan = plan_chunks(runs, fixed, per_run, offered, buffered=depth * per_run)
    except AiocubieError:
        assert fixed + per_run * runs > offered  # it does not fit whole either
        assert fixed > offered or fixed + depth * per_run > offered
        return
    if plan.chunks == 1:
        assert fixed + per_run * runs <= offered  # whole: one buffer is enough
        return
    buffers = min(depth, plan.chunks)
    assert buffers == depth  # a chunked plan uses every buffer it budgets
    assert fixed + buffers * per_run * plan.chunk_length <= plan.planned_bytes <= offered
    assert math.ceil(runs / plan.chunk_length) == plan.chunks
    fewer = plan.chunks - 1  # one chunk fewer would not fit the buffers
    assert fixed + depth * per_run * math.ceil(runs / fewer) > offered or fewer == 1


def test_plan_batch_counts_buffers_of_vram_kinds_only() -> None:
    batch = {
        "a": walk_requests(
            {"x": ArrayRequest((100, 10), np.float32), "h": ArrayRequest((100, 10), np.float32, "pinned")}, 3
        )
    }
    plan = plan_batch(batch, 40 * 30 * 3)
    assert plan.chunks > 3 and plan.planned_bytes <= 40 * 30 * 3
    assert plan.planned_bytes == 3 * 40 * plan.chunk_length


@pytest.mark.anyio
async def test_requests_get_their_buffers_within_budget_and_one_when_whole() -> None:
    requests = walk_requests(
        {"x": ArrayRequest((100, 10), np.float32), "s": ArrayRequest((100, 10), np.float32)}, 3, labels=["x"]
    )
    async with MemoryManager(SimulatorBackend(1 << 20), headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        async with mgr.request(solver, requests) as whole:
            assert whole.chunks == 1 and whole.buffer_count("x") == 1
    sim = SimulatorBackend(4 * 40 * 25)
    async with MemoryManager(sim, headroom=0.0) as mgr:
        mgr.register(solver)
        async with mgr.request(solver, requests) as response:
            assert response.chunks > 1
            assert response.buffer_count("x") == 3 and response.buffer_count("s") == 1
            assert len({id(b) for b in response.buffers["x"]}) == 3 and response.buffers["x"][0] is response.arrays["x"]
            assert sim.used == 4 * 40 * response.chunk_length <= sim.total
        assert sim.used == 0


def test_bad_buffers_and_depths_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="positive integer"):
        ArrayRequest((3,), np.float32, buffers=0)
    with pytest.raises(InvalidRequestError, match="unchunkable"):
        ArrayRequest((3,), np.float32, unchunkable=True, buffers=2)
    with pytest.raises(InvalidRequestError, match="depth"):
        walk_requests({"x": ArrayRequest((3,), np.float32)}, 0)
    with pytest.raises(InvalidRequestError, match="not among"):
        walk_requests({"x": ArrayRequest((3,), np.float32)}, 2, labels=["q"])


@pytest.mark.anyio
async def test_a_walk_deeper_than_its_buffers_is_refused() -> None:
    requests = _requests(0, np.float64)
    async with MemoryManager(SimulatorBackend(_budget(requests, 1, 2)), headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        async with mgr.request(solver, requests) as response:
            with pytest.raises(InvalidRequestError, match=r"walk_requests\(requests, depth=2\)"):
                async for _ in walk_chunks(response, inputs={"x": np.zeros(SHAPES[0])}, depth=2):
                    pass


# -- the pinned pool ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_pageable_walks_stage_through_exact_reused_pinned_buffers() -> None:
    requests = walk_requests({"x": ArrayRequest((40, 1000), np.float32), "y": ArrayRequest((40, 1000), np.float32)}, 2)
    sim = SimulatorBackend(2 * 8000 * 10 + 100)
    x = np.ones((40, 1000), np.float32)
    y = np.zeros_like(x)
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        for _ in range(3):  # reused across walks
            async with mgr.request(solver, requests) as response:
                async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}):
                    chunk.device["y"][...] = chunk.device["x"] + 1
        np.testing.assert_array_equal(y, 2)
        pinned = mgr.stats().pinned
        staged = 2 * 2 * 4000 * response.chunk_length  # depth x (in + out) x chunk bytes
        assert pinned.peak_in_use == staged and pinned.held <= 1.1 * staged
        assert pinned.in_use == 0 and pinned.pinned == 4  # pinned once, then reused
        assert mgr.host.release_pinned() == pinned.held
        assert mgr.stats().pinned.held == 0


def test_create_host_array_draws_from_the_pool() -> None:
    mgr = MemoryManager(SimulatorBackend(1 << 20))
    a = mgr.host.array((10, 3), np.float64, "pinned", pool=True)
    assert a.shape == (10, 3) and not a.any() and mgr.backend.device.is_pinned(a[2:])
    assert mgr.stats().pinned.in_use == 240
    del a
    gc.collect()
    assert mgr.stats().pinned.in_use == 0 and mgr.stats().pinned.held == 240
    b = mgr.host.array(30, np.float64, "pinned", pool=True)  # the same buffer again
    assert mgr.stats().pinned.pinned == 1 and b.shape == (30,)
    assert not mgr.backend.device.is_pinned(np.zeros(3))
    mgr.close()


@pytest.mark.anyio
async def test_a_groups_copy_streams_are_made_once_by_the_group_and_handed_to_every_response_on_its_stream() -> None:
    sim = SimulatorBackend(total=1 << 15)  # 32 KiB: the 64 KiB walk is chunked
    async with MemoryManager(sim, headroom=0.0) as mgr:
        a, b, c = object(), object(), object()
        mgr.register(a, stream_group="one")
        mgr.register(b, stream_group="one")
        mgr.register(c, stream_group="two")
        requests = walk_requests({"x": ArrayRequest((4, 1 << 12), np.float32, chunk_axis=1)})
        x = np.arange(4 << 12, dtype=np.float32).reshape(4, 1 << 12)
        y = np.empty_like(x)
        first = await mgr.request(a, requests)
        assert first.chunks > 1 and first._copy_streams is not None
        pair = first._copy_streams()
        for _ in range(2):  # every walk of the group's stream: the same two
            async for _chunk in walk_chunks(first, inputs={"x": x}, outputs={"x": y}):
                pass
        assert first._copy_streams() is pair and first.stream not in pair and pair[0] is not pair[1]
        assert np.array_equal(x, y)
        mgr.release(first)
        second = await mgr.request(b, requests)
        assert second._copy_streams is first._copy_streams  # one group, one pair
        mgr.release(second)
        other = await mgr.request(c, requests)
        assert other._copy_streams is not None and other._copy_streams() != pair
        mgr.release(other)
        mgr.groups.reinit_streams()  # a new stream: new copy streams with it
        third = await mgr.request(a, requests)
        assert third._copy_streams is not None and third._copy_streams() != pair
        mgr.release(third)
