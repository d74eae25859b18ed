"""A batch stream (issue 21): ordered requests, one-chunk walks that wait only for their outputs,
k batches in flight, and waits that poll a pollable event before the thread bridge.

Runs on the simulator under asyncio and trio. Where a test needs the device to be behind the
host, it holds the group's stream on a gate (a kernel that waits for a ``threading.Event``), so
no assertion depends on timing. Walks run with pageable and with pinned host arrays: a one-chunk
walk of pinned arrays copies straight on the group's stream, one of pageable arrays stages them.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager, walk_batches, walk_chunks, walk_requests
from aiocubie._backends._sim import host_data
from aiocubie._backends._sim._streams import SimEvent
from aiocubie._bench import InstantBackend
from aiocubie._completion import Loop
from aiocubie.errors import BackendError, InvalidRequestError, ReleasedError
from aiocubie.simulator import Engines, SimulatorBackend

SHAPE = (8, 16)


def _requests(depth: int = 2) -> dict[str, ArrayRequest]:
    return walk_requests({"x": ArrayRequest(SHAPE, np.float32), "y": ArrayRequest(SHAPE, np.float32)}, depth)


def _kernel(sim: SimulatorBackend, chunk: Any) -> None:
    dx, dy = host_data(chunk.device["x"]), host_data(chunk.device["y"])
    sim.launch(chunk.stream, lambda: np.multiply(dx, 2, out=dy))


def _host(mgr: MemoryManager, arrays: list[np.ndarray], pinned: bool) -> list[np.ndarray]:
    """``arrays`` as they are, or copied into pinned host arrays of the manager's device."""
    return [mgr.host.array(a.shape, a.dtype, "pinned", like=a) for a in arrays] if pinned else arrays


def _batches(mgr: MemoryManager, count: int, pinned: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``count`` batches: inputs (batch b all b) and outputs (NaN), pinned or pageable."""
    xs = _host(mgr, [np.full(SHAPE, b, np.float32) for b in range(count)], pinned)
    return xs, _host(mgr, [np.full(SHAPE, np.nan, np.float32) for _ in xs], pinned)


def _idle(sim: SimulatorBackend) -> bool:
    # at most the item that completed the walk's last event may still be counting itself done
    return all(s.pending <= 1 for s in sim.device.streams)


HOSTS = pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])


def _gate(sim: SimulatorBackend, stream: Any) -> threading.Event:
    """Hold ``stream`` until the returned event is set."""
    gate = threading.Event()
    sim.launch(stream, lambda: gate.wait(10))
    return gate


@pytest.mark.anyio
async def test_an_ordered_request_resolves_before_its_event_and_the_hook_waits_for_it() -> None:
    sim = SimulatorBackend(1 << 24)
    called: list[Any] = []
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner, ready_hook=called.append)
        gate = _gate(sim, mgr.groups.stream(owner))
        try:
            # the default: the request resolves when the device reaches the allocation
            with anyio.move_on_after(0.2) as scope:
                await mgr.request(owner, _requests())
            assert scope.cancelled_caught
            response = await mgr.request(owner, _requests(), ordered=True)
            assert response.ready is not None and not response.ready.query()  # the device has not got there
            assert called == []  # the ready hook still waits for the event
        finally:
            gate.set()
        await anyio.to_thread.run_sync(response.ready.synchronize)
        with anyio.fail_after(5):  # called once the event completes (after the cancelled one's batch)
            while not any(c is response for c in called):
                await anyio.sleep(0.01)
        mgr.release(response)
    assert sim.used == 0


@pytest.mark.anyio
@HOSTS
async def test_a_one_chunk_walk_with_overlap_queues_behind_the_stream_and_waits_for_its_outputs(pinned: bool) -> None:
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        x, y = _host(
            mgr, [np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE), np.zeros(SHAPE, np.float32)], pinned
        )
        owner = object()
        mgr.register(owner)
        gate = _gate(sim, mgr.groups.stream(owner))
        entered = []
        with anyio.fail_after(10):
            async with mgr.request(owner, _requests(), ordered=True) as response:
                assert response.chunks == 1
                async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, overlap=True):
                    # reached with the stream still held: the walk did not wait for the copy in
                    entered.append(gate.is_set())
                    assert chunk.stream is response.stream
                    _kernel(sim, chunk)
                    gate.set()
                np.testing.assert_array_equal(y, 2 * x)  # the walk waited for the outputs
        assert entered == [False]
    assert sim.used == 0


@pytest.mark.anyio
@HOSTS
@pytest.mark.parametrize("depth", [1, 2])
async def test_the_walk_of_one_chunk_without_overlap_still_waits_for_its_copy_in(depth: int, pinned: bool) -> None:
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        x, y = _host(mgr, [np.ones(SHAPE, np.float32), np.zeros(SHAPE, np.float32)], pinned)
        owner = object()
        mgr.register(owner)
        entered = anyio.Event()

        async def walk() -> None:
            async with mgr.request(owner, _requests(depth), ordered=True) as response:
                async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, depth=depth):
                    entered.set()
                    np.testing.assert_array_equal(host_data(chunk.device["x"]), x)  # on the device already
                    _kernel(sim, chunk)

        gate = _gate(sim, mgr.groups.stream(owner))
        async with anyio.create_task_group() as tg:
            tg.start_soon(walk)
            with anyio.move_on_after(0.2):
                await entered.wait()
            assert not entered.is_set()
            gate.set()
        np.testing.assert_array_equal(y, 2 * x)
    assert sim.used == 0


async def _loader(
    mgr: MemoryManager, sim: SimulatorBackend, xs: list[np.ndarray], ys: list[np.ndarray], k: int, groups: int
) -> None:
    """The loader for batches whose shapes vary (docs/concepts/walks.md, "A batch stream"): k tasks, each request -> walk -> release."""
    requests = _requests()
    owners = [object() for _ in range(k)]
    for i, owner in enumerate(owners):
        mgr.register(owner, stream_group=f"g{i % groups}")

    async def worker(i: int) -> None:
        for b in range(i, len(xs), k):
            async with mgr.request(owners[i], requests, ordered=True) as response:
                async for chunk in walk_chunks(response, inputs={"x": xs[b]}, outputs={"y": ys[b]}, overlap=True):
                    _kernel(sim, chunk)

    async with anyio.create_task_group() as tg:
        for i in range(k):
            tg.start_soon(worker, i)


@pytest.mark.anyio
@HOSTS
@pytest.mark.parametrize("k, groups", [(1, 1), (4, 1), (4, 4)])
async def test_a_loader_with_k_batches_in_flight_gets_every_output(k: int, groups: int, pinned: bool) -> None:
    sim = SimulatorBackend(1 << 24, latency=1e-4)
    async with MemoryManager(sim) as mgr:
        xs, ys = _batches(mgr, 24, pinned)
        await _loader(mgr, sim, xs, ys, k, groups)
        assert mgr.stats().groups  # served through the groups' schedulers
        for x, y in zip(xs, ys):
            np.testing.assert_array_equal(y, 2 * x)
    assert sim.used == 0


@pytest.mark.anyio
@HOSTS
async def test_a_loader_cancelled_mid_stream_frees_everything_it_held(pinned: bool) -> None:
    sim = SimulatorBackend(1 << 24, latency=2e-3)
    async with MemoryManager(sim) as mgr:
        xs = _host(mgr, [np.full(SHAPE, b, np.float32) for b in range(200)], pinned)
        ys = _host(mgr, [np.zeros(SHAPE, np.float32) for _ in xs], pinned)
        with anyio.move_on_after(0.1) as scope:
            await _loader(mgr, sim, xs, ys, 4, 1)
        assert scope.cancelled_caught
        assert _idle(sim)  # the walks cancelled waited for the copies they queued
        assert mgr.stats().live_bytes == 0
        assert mgr.backend.device.pinned_pool.in_use == 0
        done = [b for b, (x, y) in enumerate(zip(xs, ys)) if np.array_equal(y, 2 * x)]
    assert sim.used == 0
    assert 0 < len(done) < len(xs)


@pytest.mark.anyio
@HOSTS
async def test_a_copy_fault_mid_stream_fails_that_batch_and_frees_everything(pinned: bool) -> None:
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        xs = _host(mgr, [np.full(SHAPE, b, np.float32) for b in range(16)], pinned)
        ys = _host(mgr, [np.zeros(SHAPE, np.float32) for _ in xs], pinned)
        sim.faults.inject("copy", after=9)
        with pytest.raises(BaseExceptionGroup) as raised:
            await _loader(mgr, sim, xs, ys, 4, 1)
        assert raised.group_contains(BackendError, match="injected fault")
        assert mgr.stats().live_bytes == 0
    assert sim.used == 0


@pytest.mark.anyio
@pytest.mark.parametrize("pollable", [False, True])
async def test_a_wait_polls_a_pollable_event_and_is_cancellable_while_it_polls(
    monkeypatch: pytest.MonkeyPatch, pollable: bool
) -> None:
    monkeypatch.setattr(SimEvent, "pollable", pollable)
    sim = SimulatorBackend(1 << 20)
    device = sim.device
    stream = device.create_stream()
    loop = Loop()
    gate = _gate(sim, stream)
    event = device.record_event(stream)
    with anyio.move_on_after(0.05) as scope:  # polls (pollable), then waits on the callback
        await loop.wait(event, spin=0.01)
    assert scope.cancelled_caught and not event.query()
    gate.set()
    with anyio.fail_after(5):
        await loop.wait(event, spin=10.0)  # done long before the spin would end
    assert event.query()


@pytest.mark.anyio
async def test_a_request_on_a_pollable_event_polls_it_then_sleeps_until_it_completes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SimEvent, "pollable", True)
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        gate = _gate(sim, mgr.groups.stream(owner))
        with anyio.move_on_after(0.05) as scope:  # polls, then sleeps on the callback: cancelled
            await mgr.request(owner, _requests())
        assert scope.cancelled_caught
        gate.set()
        with anyio.fail_after(5):
            responses = [await mgr.request(owner, _requests()) for _ in range(20)]  # polled or woken
        assert all(r.ready.query() for r in responses)
        assert mgr.stats().groups["default"].cancellations == 1
        for response in responses:
            mgr.release(response)
    assert sim.used == 0


@pytest.mark.anyio
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("ordered", [False, True])
async def test_a_chunked_walk_with_overlap_at_depth_1_gets_every_output(in_place: bool, ordered: bool) -> None:
    sim = SimulatorBackend(1 << 24, latency=1e-4)
    runs = 40
    x = np.arange(runs * 16, dtype=np.float32).reshape(runs, 16)
    y = x.copy() if in_place else np.zeros_like(x)
    # x zeroed on the group's stream: a copy in that did not wait for the allocation would be zeroed over
    requests = {"x": ArrayRequest.like(x, zero=True)}
    if not in_place:
        requests["y"] = ArrayRequest.like(y)
    async with MemoryManager(sim, mode="active", headroom=0.0) as mgr:
        owner = object()
        mgr.register(owner, proportion=(x.nbytes // 4) / sim.total)  # 4 chunks or more
        # the allocation held back: an ordered response's copy streams must wait for it
        gate = _gate(sim, mgr.groups.stream(owner)) if ordered else threading.Event()
        async with mgr.request(owner, requests, ordered=ordered) as response:
            assert response.ready.query() is not ordered
            assert response.chunks > 2
            outputs = {"x": y} if in_place else {"y": y}
            async for chunk in walk_chunks(response, inputs={"x": y if in_place else x}, outputs=outputs, overlap=True):
                dx = host_data(chunk.device["x"])
                dy = dx if in_place else host_data(chunk.device["y"])
                sim.launch(chunk.stream, lambda dx=dx, dy=dy: np.multiply(dx, 2, out=dy))
                gate.set()  # after chunk 0's copy in was queued
    np.testing.assert_array_equal(y, 2 * x)
    assert sim.used == 0


@pytest.mark.anyio
async def test_overlap_must_be_a_bool_or_none() -> None:
    async with MemoryManager(SimulatorBackend(1 << 20)) as mgr:
        owner = object()
        mgr.register(owner)
        async with mgr.request(owner, _requests()) as response:
            with pytest.raises(InvalidRequestError, match="overlap must be True, False or None"):
                async for _ in walk_chunks(response, overlap="yes"):  # type: ignore[arg-type]
                    pass


@pytest.mark.anyio
async def test_a_loaders_requests_are_checked_once_and_again_when_the_dict_changes(monkeypatch: Any) -> None:
    import aiocubie._entry

    checked: list[object] = []
    check = aiocubie._entry.check_requests
    monkeypatch.setattr(aiocubie._entry, "check_requests", lambda requests: checked.append(requests) or check(requests))
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        requests = _requests()
        responses = []
        for _ in range(3):  # a loader's requests, made once
            async with mgr.request(owner, requests, ordered=True) as response:
                responses.append(response)
        assert len(checked) == 1
        # each response has its own shapes and axes, though one checked set served them all
        first, second = responses[0], responses[1]
        assert first.chunked_shapes == second.chunked_shapes and first.chunked_shapes is not second.chunked_shapes
        assert first.chunk_axes == second.chunk_axes and first.chunk_axes is not second.chunk_axes
        requests["z"] = ArrayRequest((4,), np.float32, unchunkable=True)  # changed: checked again
        async with mgr.request(owner, requests, ordered=True) as response:
            assert set(response.arrays) == {"x", "y", "z"} and response.chunk_axes["z"] is None
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunked_shapes["z"] == (4,)
        assert len(checked) == 2
        requests["z"] = ArrayRequest((2, 3), np.float32, unchunkable=True)  # a new object: checked again
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunked_shapes["z"] == (2, 3)
        assert len(checked) == 3
        requests["z"] = np.zeros(4)  # type: ignore[assignment]
        with pytest.raises(InvalidRequestError, match="not an ArrayRequest"):
            mgr.request(owner, requests)
        del requests["z"]
        requests["x"] = ArrayRequest((SHAPE[0] + 1, SHAPE[1]), np.float32)
        with pytest.raises(InvalidRequestError, match="run length"):
            mgr.request(owner, requests)
        view = MappingProxyType(_requests())  # not a dict: checked every time
        for _ in range(2):
            async with mgr.request(owner, view, ordered=True):
                pass
        assert len(checked) == 7
    assert sim.used == 0


@pytest.mark.anyio
async def test_a_stream_of_one_request_is_planned_again_when_the_mode_or_the_member_alone_in_its_group_changes() -> (
    None
):
    # what the last one-chunk plan was worked out from includes the options and the member: a
    # plan reused across a mode change, or for another member that moved into the group, would
    # allocate over a cap
    requests = {"x": ArrayRequest((96, 1024), np.float32)}  # 384 KiB
    sim = SimulatorBackend(1 << 20)
    async with MemoryManager(sim, mode="passive", headroom=0.0) as mgr:
        owner, other = object(), object()
        mgr.register(owner, proportion=0.25)  # a cap of 256 KiB, once active
        mgr.register(other, proportion=0.5, stream_group="other")  # 512 KiB
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 1  # passive: caps do not matter
        mgr.budget.set_mode("active")
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 2
            assert sim.used <= mgr.budget.cap(owner)  # its arrays alone
        mgr.budget.set_mode("passive")
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 1
        mgr.budget.set_mode("active")
        mgr.groups.move(other, "default")  # the group: owner and other
        mgr.groups.move(owner, "other")  # other alone in it, as owner was
        async with mgr.request(other, requests, ordered=True) as response:
            assert response.chunks == 1  # under other's cap
        mgr.groups.move(owner, "default")
        mgr.groups.move(other, "other")  # owner alone again, its last plan made for other
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 2
            assert sim.used <= mgr.budget.cap(owner)  # its arrays alone
    assert sim.used == 0


@pytest.mark.anyio
async def test_a_stream_of_one_request_is_planned_again_once_the_budget_holdings_or_free_memory_change() -> None:
    requests = {"x": ArrayRequest((48, 1024), np.float32)}  # 192 KiB
    sim = SimulatorBackend(1 << 20)
    async with MemoryManager(sim, mode="active", headroom=0.0) as mgr:
        owner = object()
        mgr.register(owner, proportion=0.5)  # a cap of 512 KiB
        for _ in range(2):  # the second is planned as the first was
            async with mgr.request(owner, requests, ordered=True) as response:
                assert response.chunks == 1
        held = [await mgr.request(owner, requests, ordered=True) for _ in range(2)]  # 384 KiB held
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 2  # 128 KiB left of its cap
        for response in held:
            mgr.release(response)
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 1
        mgr.budget.set_manual(owner, 0.125)  # 128 KiB
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 2
    sim = SimulatorBackend(1 << 20)
    async with MemoryManager(sim, mode="passive") as mgr:
        owner, other = object(), object()
        mgr.register(owner)
        mgr.register(other, stream_group="other")
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 1
        async with mgr.request(other, {"y": ArrayRequest((225, 1024), np.float32)}, ordered=True):  # 900 KiB
            async with mgr.request(owner, requests, ordered=True) as response:
                assert response.chunks == 2  # 124 KiB free
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 1
    assert sim.used == 0


def test_the_docs_batch_stream_snippet_runs_as_written(tmp_path: Path) -> None:
    page = (Path(__file__).parent.parent / "docs" / "concepts" / "walks.md").read_text()
    section = page[page.index("## A batch stream") :]
    start = section.index("```python\n") + len("```python\n")
    (tmp_path / "snippet.py").write_text(section[start : section.index("\n```", start)])
    result = subprocess.run(
        [sys.executable, str(tmp_path / "snippet.py")], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"32 batches, 4 in flight, y == 2x: True", result.stdout), result.stdout


@pytest.mark.anyio
@HOSTS
async def test_a_loader_may_keep_its_response_and_walk_batch_after_batch_through_its_buffers(pinned: bool) -> None:
    sim = SimulatorBackend(1 << 24, latency=1e-4)
    async with MemoryManager(sim) as mgr:
        xs = _host(mgr, [np.full(SHAPE, b, np.float32) for b in range(12)], pinned)
        ys = _host(mgr, [np.zeros(SHAPE, np.float32) for _ in xs], pinned)
        owner = object()
        mgr.register(owner)
        async with mgr.request(owner, _requests(), ordered=True) as response:
            for x, y in zip(xs, ys):  # each walk returns once its outputs landed: the buffers are free again
                async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, overlap=True):
                    _kernel(sim, chunk)
        assert mgr.stats().groups["default"].requests == 1
        for x, y in zip(xs, ys):
            np.testing.assert_array_equal(y, 2 * x)
    assert sim.used == 0


@pytest.mark.anyio
@pytest.mark.parametrize("axis", [0, 1, -1])
async def test_a_one_chunk_walk_of_pinned_arrays_copies_every_layout_and_its_whole_arrays(axis: int) -> None:
    shape = {0: (12, 3, 5), 1: (3, 12, 5), -1: (3, 5, 12)}[axis]
    rng = np.random.default_rng(axis + 1)
    data = {"x": rng.standard_normal(shape).astype(np.float32), "p": np.arange(1, 5, dtype=np.float32)}
    requests = walk_requests(
        {
            "x": ArrayRequest(shape, np.float32, chunk_axis=axis),
            "y": ArrayRequest(shape, np.float32, chunk_axis=axis),
            "p": ArrayRequest((4,), np.float32, unchunkable=True),
            "total": ArrayRequest((1,), np.float32, unchunkable=True),
        }
    )
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        x, p = _host(mgr, [data["x"], data["p"]], True)
        y, total = _host(mgr, [np.zeros(shape, np.float32), np.zeros(1, np.float32)], True)
        async with mgr.request(owner, requests, ordered=True) as response:
            assert response.chunks == 1
            async for chunk in walk_chunks(response, inputs={"x": x, "p": p}, outputs={"y": y, "total": total}):
                d = chunk.device
                assert (chunk.start, chunk.stop, chunk.length) == (0, shape[axis], shape[axis])
                assert chunk.host["x"].shape == shape and chunk.host["total"].shape == (1,)
                d["y"][...] = d["x"] * 3 + d["p"].sum()
                d["total"][0] = d["p"].sum()
        np.testing.assert_array_equal(y, data["x"] * 3 + data["p"].sum())
        assert total[0] == data["p"].sum()
        assert mgr.stats().pinned.peak_in_use == 0  # straight: nothing staged
    assert sim.used == 0


async def _leave(how: str, scope: anyio.CancelScope, mgr: MemoryManager, response: Any) -> bool:
    """Leave a walk's body as ``how`` says: True to break; else raise, cancel ``scope`` or release."""
    if how == "raise":
        raise KeyError("body failed")
    if how == "cancel":
        scope.cancel()
        await anyio.sleep(0)
    if how == "release":
        mgr.release(response)
    return how == "break"


@pytest.mark.anyio
@HOSTS
@pytest.mark.parametrize("how", ["break", "raise", "cancel", "release"])
async def test_leaving_a_one_chunk_walk_early_waits_for_what_it_queued(how: str, pinned: bool) -> None:
    shape = (256, 256)  # 256 KiB a copy at 20 MB/s: the copies are still running when the body leaves
    sim = SimulatorBackend(1 << 24, engines=Engines(h2d_bandwidth=2e7, d2h_bandwidth=2e7))
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        x, y = _host(mgr, [np.ones(shape, np.float32), np.zeros(shape, np.float32)], pinned)
        requests = walk_requests({"x": ArrayRequest.like(x), "y": ArrayRequest.like(y)})
        with anyio.CancelScope() as scope:
            async with mgr.request(owner, requests, ordered=True) as response:
                assert response.chunks == 1
                walk = walk_chunks(response, inputs={"x": x}, outputs={"y": y}, overlap=True)
                try:
                    async with contextlib.aclosing(walk):
                        async for chunk in walk:
                            _kernel(sim, chunk)  # queued behind the copy in, still running
                            if await _leave(
                                how, scope, mgr, response
                            ):  # a release: the copy out would read freed memory
                                break
                except KeyError:
                    assert how == "raise"
                except ReleasedError as exc:
                    assert how == "release" and "walk_chunks" in str(exc)
                assert _idle(sim)  # the copies it queued are done before the arrays are freed
        assert scope.cancelled_caught is (how == "cancel")
        assert _idle(sim)
        if how != "release":
            assert not y.any()  # no copy out after a body that did not finish
        assert mgr.stats().live_bytes == 0 and mgr.backend.device.pinned_pool.in_use == 0
    assert sim.used == 0


@pytest.mark.anyio
@HOSTS
@pytest.mark.parametrize("at", [0, 1, 2, 3])
async def test_a_copy_fault_in_a_one_chunk_walk_is_a_backend_error_and_leaks_nothing(at: int, pinned: bool) -> None:
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        x, z, y = _host(
            mgr, [np.ones(SHAPE, np.float32), np.ones(SHAPE, np.float32), np.zeros(SHAPE, np.float32)], pinned
        )
        requests = {"x": ArrayRequest.like(x), "z": ArrayRequest.like(z), "y": ArrayRequest.like(y)}
        async with mgr.request(owner, requests, ordered=True) as response:
            sim.faults.inject("copy", after=at)
            with pytest.raises(BackendError, match="injected fault"):  # 2 copies in, 2 out
                async for chunk in walk_chunks(
                    response, inputs={"x": x, "z": z}, outputs={"y": y, "z": z}, overlap=True
                ):
                    chunk.device["y"][...] = chunk.device["x"] + chunk.device["z"]
            assert _idle(sim)
        assert mgr.stats().live_bytes == 0 and mgr.backend.device.pinned_pool.in_use == 0
    assert sim.used == 0


@pytest.mark.anyio
@pytest.mark.parametrize("chunk_axis", [0, None], ids=["chunked", "unchunkable"])
async def test_a_one_chunk_walk_of_empty_pinned_views_with_any_strides_copies_nothing(chunk_axis: int | None) -> None:
    # a zero-size numpy view says it is C-contiguous whatever its strides (here reversed along
    # the last axis): a copy of it moves nothing, on the simulator as on a GPU
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        shape = (0, 4)
        x, y = (mgr.host.array(shape, np.float32, "pinned") for _ in range(2))
        request = ArrayRequest(shape, np.float32, chunk_axis=0, unchunkable=chunk_axis is None)
        async with mgr.request(owner, {"x": request, "y": request}) as response:
            assert response.chunks == 1
            for overlap in (False, True):
                bodies = 0
                async for chunk in walk_chunks(
                    response, inputs={"x": x[:, ::-1]}, outputs={"y": y[:, ::-1]}, overlap=overlap
                ):
                    assert chunk.device["x"].shape == shape
                    bodies += 1
                assert bodies == 1
    assert sim.used == 0


# -- walk_batches: a stream of batches of one shape through one response, k in flight ----------------


async def _walk_behind_a_gate(
    sim: SimulatorBackend, mgr: MemoryManager, owner: object, batches: Any, in_flight: int, in_place: bool = False
) -> None:
    """``walk_batches`` of ``batches`` through a new response of ``owner``, the group's stream held
    on a gate for 50 ms: the host runs ahead of the device until the walk waits for it. The body
    doubles x into y, or y in place."""

    async def open_later(gate: threading.Event) -> None:
        await anyio.sleep(0.05)
        gate.set()

    async with mgr.request(owner, _requests(1), ordered=True) as response:
        gate = _gate(sim, response.stream)
        async with anyio.create_task_group() as tg:
            tg.start_soon(open_later, gate)
            async for chunk in walk_batches(response, batches, in_flight=in_flight):
                if in_place:
                    dy = host_data(chunk.device["y"])
                    sim.launch(chunk.stream, lambda dy=dy: np.multiply(dy, 2, out=dy))
                else:
                    _kernel(sim, chunk)


def _pairs(xs: list[np.ndarray], ys: list[np.ndarray]) -> Any:
    return (({"x": x}, {"y": y}) for x, y in zip(xs, ys))


@pytest.mark.anyio
@HOSTS
@pytest.mark.parametrize("in_flight", [1, 4])
async def test_walk_batches_gets_every_batch_through_one_response(in_flight: int, pinned: bool) -> None:
    sim = SimulatorBackend(1 << 24, latency=1e-4)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        xs, ys = _batches(mgr, 24, pinned)
        seen = []
        async with mgr.request(owner, _requests(1), ordered=True) as response:
            async for chunk in walk_batches(response, _pairs(xs, ys), in_flight=in_flight):
                seen.append(chunk.index)
                assert np.shares_memory(chunk.host["x"], xs[chunk.index]) and chunk.length == SHAPE[0]
                if in_flight == 1 and chunk.index:  # the last batch landed before this one started
                    np.testing.assert_array_equal(ys[chunk.index - 1], 2 * xs[chunk.index - 1])
                _kernel(sim, chunk)
        assert seen == list(range(24))
        for x, y in zip(xs, ys):  # every output landed when the loop ended
            np.testing.assert_array_equal(y, 2 * x)
        assert mgr.stats().live_bytes == 0 and mgr.backend.device.pinned_pool.in_use == 0
    assert sim.used == 0


@pytest.mark.anyio
async def test_walk_batches_queues_batches_without_waiting_for_the_ones_before() -> None:
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        xs, ys = _batches(mgr, 8, True)
        async with mgr.request(owner, _requests(1), ordered=True) as response:
            gate = _gate(sim, response.stream)  # the device is held before the first batch's copy in
            async for chunk in walk_batches(response, _pairs(xs, ys), in_flight=4):
                _kernel(sim, chunk)
                if chunk.index == 3:  # four batches queued, none landed: the host never waited
                    assert all(np.isnan(y).all() for y in ys[:4])
                    gate.set()
        for x, y in zip(xs, ys):
            np.testing.assert_array_equal(y, 2 * x)
    assert sim.used == 0


def _ring(xs: list[np.ndarray], ys: list[np.ndarray], outputs: list[np.ndarray], batches: int) -> Any:
    """A loader that refills a ring of host buffers: batch b's inputs are b + 1; before it refills a
    slot it keeps what the last batch of that slot left in its output buffer."""
    for b in range(batches):
        slot = b % len(xs)
        if b >= len(xs):
            outputs.append(ys[slot].copy())  # batch b - len(xs)'s
        xs[slot][...] = b + 1
        yield {"x": xs[slot]}, {"y": ys[slot]}


async def _async_ring(xs: list[np.ndarray], ys: list[np.ndarray], outputs: list[np.ndarray], batches: int) -> Any:
    """:func:`_ring` as an async loader that awaits (its I/O) before each batch."""
    for batch in _ring(xs, ys, outputs, batches):
        await anyio.sleep(0.001)
        yield batch


@pytest.mark.anyio
@pytest.mark.parametrize("in_flight", [1, 3])
@pytest.mark.parametrize("ring", [_ring, _async_ring], ids=["iterable", "async iterable"])
async def test_walk_batches_asks_for_a_batch_only_once_the_batch_in_flight_before_it_landed(
    in_flight: int, ring: Any
) -> None:
    # a loader that refills a ring of in_flight pinned buffers: when it is asked for batch b, the
    # copy in of batch b - in_flight has run and its outputs are in their host array
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        xs = _host(mgr, [np.zeros(SHAPE, np.float32) for _ in range(in_flight)], True)
        ys = _host(mgr, [np.zeros(SHAPE, np.float32) for _ in range(in_flight)], True)
        outputs: list[np.ndarray] = []
        await _walk_behind_a_gate(sim, mgr, owner, ring(xs, ys, outputs, 8), in_flight)
        outputs += [ys[b % in_flight] for b in range(8 - in_flight, 8)]
        for b, y in enumerate(outputs):
            np.testing.assert_array_equal(y, np.full(SHAPE, 2 * (b + 1), np.float32), err_msg=f"batch {b}")
    assert sim.used == 0


@pytest.mark.anyio
@HOSTS
async def test_walk_batches_of_an_async_loader_that_fails_or_is_cancelled_waits_for_what_it_queued(
    pinned: bool,
) -> None:
    sim = SimulatorBackend(1 << 24, latency=1e-4)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        xs, ys = _batches(mgr, 6, pinned)
        stuck = anyio.Event()

        async def loader(fail: bool) -> Any:
            for b, (x, y) in enumerate(zip(xs, ys)):
                if b == 4:
                    if fail:
                        raise OSError("the file went away")
                    stuck.set()
                    await anyio.sleep_forever()  # waiting for data that does not come
                yield {"x": x}, {"y": y}

        async with mgr.request(owner, _requests(1), ordered=True) as response:
            with pytest.raises(OSError, match="went away"):
                async for chunk in walk_batches(response, loader(True), in_flight=4):
                    _kernel(sim, chunk)
            assert _idle(sim)  # the batches it had queued were waited for
            for x, y in zip(xs[:4], ys[:4]):
                np.testing.assert_array_equal(y, 2 * x)
            with anyio.move_on_after(5) as scope:
                async with anyio.create_task_group() as tg:

                    async def walk() -> None:
                        async for chunk in walk_batches(response, loader(False), in_flight=4):
                            _kernel(sim, chunk)

                    tg.start_soon(walk)
                    await stuck.wait()
                    tg.cancel_scope.cancel()
            assert not scope.cancelled_caught and _idle(sim)
        assert mgr.stats().live_bytes == 0 and mgr.backend.device.pinned_pool.in_use == 0
    assert sim.used == 0


@pytest.mark.anyio
@pytest.mark.parametrize("in_place", [False, True], ids=["x to y", "y in place"])
async def test_walk_batches_keeps_each_batchs_host_arrays_until_it_landed(monkeypatch: Any, in_place: bool) -> None:
    # a loader that leases a pooled pinned buffer a batch and lets it go: a GPU's copy knows only its
    # address, so the walk must hold it until its copy in ran, or the next lease reuses it meanwhile
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        ys = _host(mgr, [np.zeros(SHAPE, np.float32) for _ in range(8)], True)
        lost: list[Any] = []
        copy = sim.device.copy_strided

        def copy_by_address(src: Any, dst: Any, stream: Any, *, tag: object = None) -> None:
            if not isinstance(src, np.ndarray):  # a copy out: the test holds the outputs
                return copy(src, dst, stream, tag=tag)
            host, target = weakref.ref(src), host_data(dst)  # what the copy engine will read, by address
            stream.enqueue(lambda: lost.append(tag) if host() is None else np.copyto(target, host()))
            return None

        monkeypatch.setattr(sim.device, "copy_strided", copy_by_address)

        def loader() -> Any:
            for b in range(8):
                x = mgr.host.array(SHAPE, np.float32, "pinned", like=np.full(SHAPE, b + 1), pool=True)
                if in_place:  # y's input is the leased buffer, its output ys[b]: the walk must hold both
                    yield {"y": x}, {"y": ys[b]}
                else:
                    yield {"x": x}, {"y": ys[b]}

        await _walk_behind_a_gate(sim, mgr, owner, loader(), 8, in_place)  # every batch queued before a copy runs
        assert lost == []
        for b, y in enumerate(ys):
            np.testing.assert_array_equal(y, np.full(SHAPE, 2 * (b + 1), np.float32), err_msg=f"batch {b}")
        assert mgr.backend.device.pinned_pool.in_use == 0
    assert sim.used == 0


@pytest.mark.anyio
@pytest.mark.parametrize("in_flight", [1, 3])
async def test_walk_batches_gives_the_loop_a_turn_at_least_every_in_flight_plus_one_batches(
    in_flight: int, anyio_backend_name: str
) -> None:
    # a device that keeps ahead of the host (its events are done when recorded): the walk need not
    # wait, but other tasks still run, and a cancellation lands, within in_flight + 1 batches
    backend = InstantBackend(1 << 24)
    backend.device.is_pinned = lambda array: True  # type: ignore[method-assign]  # every host array goes straight
    turns = 0
    seen: list[int] = []  # the other task's turns when each batch is yielded

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await anyio.lowlevel.checkpoint()

    async with MemoryManager(backend) as mgr:
        owner = object()
        mgr.register(owner)
        xs, ys = _batches(mgr, 24, False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(other)
            async with mgr.request(owner, _requests(1), ordered=True) as response:
                async for chunk in walk_batches(response, _pairs(xs, ys), in_flight=in_flight):
                    seen.append(turns)
                    np.multiply(chunk.device["x"], 2, out=chunk.device["y"])
            tg.cancel_scope.cancel()
        for x, y in zip(xs, ys):
            np.testing.assert_array_equal(y, 2 * x)
    # trio runs the tasks made runnable by one round in any order, so the other task's turn after the
    # walk's may come once the walk has gone on to its next turn: seen lags one round there
    window = in_flight + 1 if anyio_backend_name == "asyncio" else 2 * (in_flight + 1)
    assert all(later > earlier for earlier, later in zip(seen, seen[window:])), seen
    assert seen[-1] < len(seen)  # and not a turn every batch: it skipped the loop where it need not wait


@pytest.mark.anyio
async def test_walk_batches_walks_a_batch_that_must_be_staged_once_the_others_landed() -> None:
    sim = SimulatorBackend(1 << 24, latency=1e-4)
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        xs, ys = _batches(mgr, 6, False)
        xs[1:4] = _host(mgr, xs[1:4], True)  # pinned between pageable ones
        ys[1:4] = _host(mgr, ys[1:4], True)
        async with mgr.request(owner, _requests(1), ordered=True) as response:
            indices = []
            async for chunk in walk_batches(response, _pairs(xs, ys)):
                indices.append(chunk.index)
                if chunk.index == 4:  # staged: the straight batches before it landed first
                    for b in range(1, 4):
                        np.testing.assert_array_equal(ys[b], 2 * xs[b])
                _kernel(sim, chunk)
        assert indices == list(range(6))
        for x, y in zip(xs, ys):
            np.testing.assert_array_equal(y, 2 * x)
        assert mgr.backend.device.pinned_pool.in_use == 0
    assert sim.used == 0


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["break", "raise", "cancel", "release", "fault"])
async def test_leaving_walk_batches_early_waits_for_what_it_queued(how: str) -> None:
    sim = SimulatorBackend(1 << 24, engines=Engines(h2d_bandwidth=2e7, d2h_bandwidth=2e7))
    async with MemoryManager(sim) as mgr:
        owner = object()
        mgr.register(owner)
        xs = _host(mgr, [np.full(SHAPE, b + 1, np.float32) for b in range(8)], True)
        ys = _host(mgr, [np.zeros(SHAPE, np.float32) for _ in xs], True)
        with anyio.CancelScope() as scope:
            async with mgr.request(owner, _requests(1), ordered=True) as response:
                if how == "fault":
                    sim.faults.inject("copy", after=5)  # batch 2's copy in
                walk = walk_batches(response, _pairs(xs, ys))
                try:
                    async with contextlib.aclosing(walk):  # type: ignore[type-var]
                        async for chunk in walk:
                            _kernel(sim, chunk)
                            if chunk.index == 3 and await _leave(how, scope, mgr, response):
                                break
                except KeyError:
                    assert how == "raise"
                except ReleasedError as exc:
                    assert how == "release" and "walk_batches" in str(exc)  # the walk the user called
                except BackendError as exc:
                    assert how == "fault" and "injected fault" in str(exc)
                assert _idle(sim)  # what it queued is done before the arrays are freed
        assert scope.cancelled_caught is (how == "cancel")
        landed = [b for b, (x, y) in enumerate(zip(xs, ys)) if np.array_equal(y, 2 * x)]
        assert landed == ([0, 1] if how == "fault" else [0, 1, 2])  # no copy out after the body that left
        assert mgr.stats().live_bytes == 0 and mgr.backend.device.pinned_pool.in_use == 0
    assert sim.used == 0


@pytest.mark.anyio
async def test_walk_batches_refuses_what_it_cannot_walk() -> None:
    sim = SimulatorBackend(1 << 24)
    async with MemoryManager(sim, headroom=0.0) as mgr:
        owner = object()
        mgr.register(owner)
        x, y = np.ones(SHAPE, np.float32), np.zeros(SHAPE, np.float32)
        async with mgr.request(owner, _requests(1), ordered=True) as response:
            for batches, words in [
                ("xy", "iterable of \\(inputs, outputs\\) pairs"),
                ({"x": x}, "iterable of \\(inputs, outputs\\) pairs"),
                ([({"x": x},)], "batch 0 of walk_batches is"),
                ([({"x": x}, {"y": y}), [{"x": x}, {"y": y}]], "batch 1 of walk_batches is"),
                ([({"x": x.astype(np.float64)}, {"y": y})], "inputs\\['x'\\] is"),
            ]:
                with pytest.raises(InvalidRequestError, match=words):
                    async for chunk in walk_batches(response, batches):  # type: ignore[arg-type]
                        _kernel(sim, chunk)
            for bad in (0, -1, True, 2.0):
                with pytest.raises(InvalidRequestError, match="in_flight must be a positive integer"):
                    async for _ in walk_batches(response, [], in_flight=bad):  # type: ignore[arg-type]
                        pass
            with pytest.raises(InvalidRequestError, match="walk_batches walks an ArrayResponse"):
                async for _ in walk_batches(object(), []):  # type: ignore[arg-type]
                    pass
    assert sim.used == 0
    async with MemoryManager(SimulatorBackend(1 << 20), headroom=0.0) as mgr:  # a batch of 4 MiB: chunked
        owner = object()
        mgr.register(owner)
        async with mgr.request(owner, {"x": ArrayRequest((1 << 14, 64), np.float32)}) as chunked:
            assert chunked.chunks > 1
            with pytest.raises(InvalidRequestError, match="fit whole"):
                async for _ in walk_batches(chunked, []):
                    pass
