"""Spilling: spillable arrays go to pinned host memory while idle and come back in ``response.use()``.

On the real simulator: every touch of a spilled array outside ``use()`` raises SpilledError, the data
comes back intact (possibly at a new address), the accounting stays exact and the host copies go back
to the pinned pool however the arrays end (a release, free_all, an unregister, a reset, the manager's
exit), on asyncio, trio and uvloop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import pytest
from simkit import HANG_GUARD, LOOPS, Part, hold_stream, wait_until

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager, walk_batches, walk_chunks
from aiocubie.errors import InsufficientMemoryError, InvalidRequestError, ReleasedError, SpilledError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

TOTAL = 1_000_000
N = 25_000  # float64: 200 kB a cache


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def cache_request(n: int = N) -> dict[str, ArrayRequest]:
    return {"c": ArrayRequest((n,), "f8", unchunkable=True, spillable=True)}


def stage_request(n: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((n,), "f8")}


async def filled(mgr: MemoryManager, part: object, value: float, n: int = N) -> ArrayResponse:
    response = await mgr.request(part, cache_request(n))
    async with response.use() as arrays:
        arrays["c"].set(np.full(n, value))
    return response


def pinned(sim: SimulatorBackend) -> int:
    return sim.device.pinned_pool.in_use


async def check(response: ArrayResponse, value: float) -> None:
    async with response.use() as arrays:
        assert (arrays["c"].get() == value).all()


@pytest.fixture
async def setup() -> AsyncIterator[tuple[SimulatorBackend, MemoryManager, Part, Part]]:
    """Active mode, policy chunk: a cache and a stage in one group of 90% of the device."""
    with SimulatorBackend(total=TOTAL) as sim:
        async with MemoryManager(sim, mode="active", policy="chunk") as mgr:
            cache, stage = Part(), Part()
            mgr.register(cache, proportion=0.5, stream_group="g")
            mgr.register(stage, proportion=0.4, stream_group="g")
            yield sim, mgr, cache, stage


def test_spillable_is_checked() -> None:
    assert ArrayRequest((4,), "f4", spillable=True).spillable
    with pytest.raises(InvalidRequestError, match="only device memory spills"):
        ArrayRequest((4,), "f4", kind="pinned", spillable=True)
    with pytest.raises(InvalidRequestError, match="spillable"):
        ArrayRequest((4,), "f4", spillable="yes")  # type: ignore[arg-type]


async def test_a_cache_spills_instead_of_chunking_and_comes_back(setup: Any) -> None:
    sim, mgr, cache, stage = setup
    response = await filled(mgr, cache, 7.0)
    old = response.arrays["c"]
    big = await mgr.request(stage, stage_request(90_000))  # 720 kB: fits whole only without the cache
    assert big.chunks == 1
    assert mgr.stats().live_bytes == 720_000  # the cache's bytes left the device account
    assert pinned(sim) == 200_000
    with pytest.raises(SpilledError):
        old.get()  # the array kept from before: its device memory is gone
    with pytest.raises(SpilledError, match="use"):
        response.arrays["c"].get()  # the response's stand-in
    assert mgr.statistics().spilled == 1
    big.release()
    await check(response, 7.0)  # restored: a request like any other
    assert response.arrays["c"] is not old
    assert pinned(sim) == 0
    assert mgr.stats().live_bytes == 200_000
    spill = mgr.stats().spill
    assert (spill.spills, spill.spilled_bytes, spill.restores, spill.restored_bytes) == (1, 200_000, 1, 200_000)
    assert (spill.now, spill.peak) == (0, 200_000)
    assert [u.spill.spills for u in mgr.stats().instances.values()] == [1, 0]  # the cache's, the stage's
    assert mgr.stats().groups["g"].spill.restores == 1
    assert "spilled:" in mgr.summary()
    response.release()
    assert mgr.stats().live_bytes == 0


async def test_in_use_arrays_do_not_spill(setup: Any) -> None:
    sim, mgr, cache, stage = setup
    response = await filled(mgr, cache, 1.0)
    async with response.use(), response.use():  # nested: counted
        big = await mgr.request(stage, stage_request(90_000))
        assert big.chunks > 1  # chunked: the cache in use stays
        big.release()
    assert pinned(sim) == 0
    big = await mgr.request(stage, stage_request(90_000))  # idle now: spilled
    assert big.chunks == 1 and pinned(sim) == 200_000
    big.release()
    await check(response, 1.0)
    response.release()


async def test_least_recently_used_spills_first_and_only_what_is_needed(setup: Any) -> None:
    _sim, mgr, cache, stage = setup
    older = await filled(mgr, cache, 1.0, 10_000)
    newer = await filled(mgr, cache, 2.0, 10_000)
    big = await mgr.request(stage, stage_request(95_000))  # 760 kB of 900: one cache of 80 kB must go
    assert big.chunks == 1
    assert mgr.statistics().spilled == 1
    with pytest.raises(SpilledError):
        older.arrays["c"].get()
    async with newer.use() as arrays:
        assert (arrays["c"].get() == 2.0).all()
    big.release()
    await check(older, 1.0)
    older.release()
    newer.release()


@pytest.mark.parametrize("how", ["register", "request"])
async def test_a_higher_priority_cache_is_not_spilled_for_a_lower_request(setup: Any, how: str) -> None:
    sim, mgr, cache, stage = setup
    if how == "register":  # the cache's instance default
        mgr.unregister(cache)
        mgr.register(cache, proportion=0.5, stream_group="g", priority=1)
        response = await filled(mgr, cache, 3.0)
    else:  # the request's own
        response = await mgr.request(cache, cache_request(N), priority=1)
        async with response.use() as arrays:
            arrays["c"].set(np.full(N, 3.0))
    assert response.lease.priority == 1
    big = await mgr.request(stage, stage_request(90_000))  # priority 0: it may not move a priority-1 cache
    assert big.chunks > 1 and pinned(sim) == 0
    big.release()
    big = await mgr.request(stage, stage_request(90_000), priority=1)  # an equal priority may
    assert big.chunks == 1 and pinned(sim) > 0
    big.release()
    await check(response, 3.0)
    response.release()


@pytest.mark.parametrize("policy", ["fail", "wait"])
async def test_spilling_serves_what_would_fail_or_wait(policy: str) -> None:
    with SimulatorBackend(total=TOTAL) as sim:
        async with MemoryManager(sim, mode="active", policy=policy) as mgr:
            cache, stage = Part(), Part()
            mgr.register(cache, proportion=0.5, stream_group="g")
            mgr.register(stage, proportion=0.4, stream_group="g")
            response = await filled(mgr, cache, 4.0)
            with anyio.fail_after(HANG_GUARD):
                big = await mgr.request(stage, stage_request(90_000))
            assert big.chunks == 1
            if policy == "fail":  # the restore is a request like any other: it fails while there is no room
                with pytest.raises(InsufficientMemoryError):
                    async with response.use():
                        pass
                big.release()
            else:  # it waits for the room

                async def later() -> None:
                    await anyio.sleep(0.01)
                    big.release()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(later)
                    with anyio.fail_after(HANG_GUARD):
                        await check(response, 4.0)
            await check(response, 4.0)
            response.release()
            assert pinned(sim) == 0


async def test_passive_mode_spills_for_free_memory() -> None:
    with SimulatorBackend(total=TOTAL) as sim:
        async with MemoryManager(sim, policy="chunk") as mgr:
            cache, stage = Part(), Part()
            mgr.register(cache, stream_group="a")
            mgr.register(stage, stream_group="b")  # another group: the free memory is what is short
            response = await filled(mgr, cache, 5.0, 50_000)
            big = await mgr.request(stage, stage_request(90_000))
            assert big.chunks == 1 and pinned(sim) == 400_000
            big.release()
            await check(response, 5.0)
            response.release()


async def test_a_chunk_kept_after_its_release_holds_no_memory_under_a_memory_limit() -> None:
    # bench_pressure's pipeline on the H100 (memory_limit below the device): a released batch's arrays, still
    # held by the walk's last chunk (a loop variable outlives its loop), stayed in the pool's use, which
    # the limit counts; the spill freed the cache, yet the next batch waited for ever
    with SimulatorBackend(total=4 * TOTAL) as sim:
        async with MemoryManager(sim, memory_limit=TOTAL, policy="wait", headroom=0.0) as mgr:
            cache, stage = Part(), Part()
            mgr.register(cache, stream_group="a")
            mgr.register(stage, stream_group="b")
            response = await filled(mgr, cache, 3.0, 50_000)  # 400 kB
            batch = await mgr.request(stage, stage_request(60_000))  # 480 kB: with the cache, 880 of 1000 kB
            async for chunk in walk_chunks(batch, inputs={"x": np.arange(60_000.0)}):
                assert chunk.device["x"].shape == (60_000,)
            batch.release()
            with pytest.raises(Exception, match="released"):
                chunk.device["x"].get()  # the chunk kept: refuses every use, as its response's arrays do
            whole = {"x": ArrayRequest((100_000,), "f8", unchunkable=True)}  # 800 kB: the cache spilled, the batch gone
            with anyio.fail_after(HANG_GUARD):
                big = await mgr.request(stage, whole)
            assert mgr.stats().spill.spills == 1
            big.release()
            await check(response, 3.0)
            response.release()


async def test_the_last_rotated_chunk_kept_after_its_release_holds_no_memory() -> None:
    with SimulatorBackend(total=4 * TOTAL) as sim:
        async with MemoryManager(sim, memory_limit=TOTAL, policy="chunk", headroom=0.0) as mgr:
            stage = Part()
            mgr.register(stage, stream_group="b")
            batch = await mgr.request(stage, stage_request(200_000))  # 1.6 MB: chunked
            assert batch.chunks > 1
            async for chunk in walk_chunks(batch, inputs={"x": np.arange(200_000.0)}):
                assert chunk.length < 200_000
            batch.release()
            assert mgr.stats().free == TOTAL  # the pool's use, which the limit counts, is back
            with pytest.raises(Exception, match="released"):
                chunk.device["x"].get()


@pytest.mark.parametrize("end", ["release", "free_all", "unregister", "invalidate_all", "exit", "free"])
async def test_host_copies_go_back_however_the_arrays_end(end: str) -> None:
    with SimulatorBackend(total=TOTAL) as sim:
        async with MemoryManager(sim, mode="active", policy="chunk") as mgr:
            cache, stage = Part(), Part()
            mgr.register(cache, proportion=0.5, stream_group="g")
            mgr.register(stage, proportion=0.4, stream_group="g")
            response = await filled(mgr, cache, 6.0)
            big = await mgr.request(stage, stage_request(90_000))
            assert pinned(sim) == 200_000
            big.release()
            if end == "release":
                response.release()
            elif end == "free_all":
                mgr.free_all()
            elif end == "free":
                mgr.free("c", cache)
            elif end == "unregister":
                mgr.unregister(cache)
            elif end == "invalidate_all":
                mgr.pool.invalidate_all()
            if end != "exit":
                assert pinned(sim) == 0
                assert mgr.statistics().spilled == 0 and mgr.stats().spill.now == 0
                assert mgr.stats().live_bytes == 0
        assert pinned(sim) == 0
        assert mgr.stats().live_bytes == 0
        with pytest.raises((SpilledError, Exception)):
            response.arrays["c"].get()


async def test_a_failed_spill_copy_leaves_the_array_resident(setup: Any) -> None:
    sim, mgr, cache, stage = setup
    response = await filled(mgr, cache, 8.0)
    sim.faults.inject("copy")
    big = await mgr.request(stage, stage_request(90_000))
    assert big.chunks > 1  # no spill: planned as if no spillable array were there
    assert pinned(sim) == 0 and mgr.statistics().spilled == 0
    assert (response.arrays["c"].get() == 8.0).all()  # resident, intact, and not refused
    big.release()
    await check(response, 8.0)  # used again: it may be spilled again
    big = await mgr.request(stage, stage_request(90_000))
    assert big.chunks == 1
    big.release()
    await check(response, 8.0)
    response.release()
    assert pinned(sim) == 0


async def test_cancelled_during_a_spill_the_array_ends_spilled_and_intact(setup: Any) -> None:
    sim, mgr, cache, stage = setup
    response = await filled(mgr, cache, 9.0)
    gate = hold_stream(mgr.groups.stream(cache))  # the spill's copy waits behind the stream's work
    try:
        with anyio.CancelScope() as scope:

            async def cancel_when_copying() -> None:
                await wait_until(lambda: pinned(sim) == 200_000)  # the copy to host is queued
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_copying)
                await mgr.request(stage, stage_request(90_000))
    finally:
        gate.set()
    await wait_until(lambda: mgr.statistics().spilled == 1)  # the spill went on, shielded
    await check(response, 9.0)
    response.release()
    assert pinned(sim) == 0 and mgr.stats().live_bytes == 0


async def test_cancelled_during_a_restore_the_array_ends_either_way_intact() -> None:
    with SimulatorBackend(total=TOTAL) as sim:
        async with MemoryManager(sim, mode="active", policy="wait") as mgr:
            cache, stage = Part(), Part()
            mgr.register(cache, proportion=0.5, stream_group="g")
            mgr.register(stage, proportion=0.4, stream_group="g")
            response = await filled(mgr, cache, 10.0)
            big = await mgr.request(stage, stage_request(90_000))
            with anyio.move_on_after(0.05):  # waits for the room: cancelled while it waits
                async with response.use():
                    raise AssertionError("restored while there was no room")
            assert mgr.statistics().spilled == 1 and pinned(sim) == 200_000
            big.release()
            gate = hold_stream(mgr.groups.stream(cache))  # the restore's copy waits
            try:
                with anyio.CancelScope() as scope:

                    async def cancel_when_allocated() -> None:
                        await wait_until(lambda: mgr.stats().live_bytes == 200_000)
                        scope.cancel()

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(cancel_when_allocated)
                        async with response.use():
                            pass
            finally:
                gate.set()
            await check(response, 10.0)
            response.release()
            assert pinned(sim) == 0 and mgr.stats().live_bytes == 0


@pytest.mark.parametrize("whole", [True, False])
async def test_released_while_its_restore_waits_for_memory(whole: bool) -> None:
    """A response released while its ``use()`` waits for the memory to restore into: its host copies are
    gone, so nothing is copied from them; ``use()`` hands out what the response holds then (stand-ins of
    the released arrays, which raise ReleasedError), and every byte goes back."""
    requests = (
        cache_request()
        if whole
        else {**cache_request(), "d": ArrayRequest((N,), "f8", unchunkable=True, spillable=True)}
    )
    with SimulatorBackend(total=TOTAL) as sim:
        async with MemoryManager(sim, policy="wait", batch_window=0) as mgr:
            cache, stage = Part(), Part()
            mgr.register(cache, stream_group="a")
            mgr.register(stage, stream_group="b")
            response = await mgr.request(cache, requests)
            async with response.use() as arrays:
                for array in arrays.values():
                    array.set(np.full(N, 3.0))
            big = await mgr.request(stage, {"y": ArrayRequest((TOTAL // 8 - N,), "f8", unchunkable=True)})
            assert mgr.statistics().spilled == 1
            seen: list[Any] = []

            async def use() -> None:
                async with response.use() as arrays:
                    seen.append(dict(arrays))

            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(use)
                    await anyio.sleep(0.05)  # the restore waits for memory
                    if whole:
                        response.release()
                    else:
                        mgr.free("c", cache)  # one of its arrays: the other comes back
                    await anyio.sleep(0.01)
                    big.release()  # the restore's memory is there now
            (arrays,) = seen
            with pytest.raises(ReleasedError):
                arrays["c"].get()
            if not whole:
                assert (arrays["d"].get() == 3.0).all()
                response.release()
            assert pinned(sim) == 0 and mgr.stats().live_bytes == 0


async def test_walks_make_spilled_responses_resident(setup: Any) -> None:
    sim, mgr, cache, stage = setup
    requests = {"x": ArrayRequest((N,), "f8", spillable=True), "y": ArrayRequest((N,), "f8", spillable=True)}
    x = np.arange(N, dtype="f8")
    y = np.empty_like(x)
    response = await mgr.request(cache, requests)
    big = await mgr.request(stage, stage_request(90_000))
    assert mgr.statistics().spilled == 1
    big.release()
    async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}):
        chunk.device["y"][...] = chunk.device["x"] * 2
    assert (y == 2 * x).all()
    big = await mgr.request(stage, stage_request(90_000))
    assert mgr.statistics().spilled == 1
    big.release()
    async for chunk in walk_batches(response, [({"x": x}, {"y": y})]):
        chunk.device["y"][...] = chunk.device["x"] + 1
    assert (y == x + 1).all()
    response.release()
    assert pinned(sim) == 0


async def test_a_response_without_spillable_arrays_uses_them_as_they_are(setup: Any) -> None:
    _sim, mgr, _cache, stage = setup
    response = await mgr.request(stage, stage_request(10))
    async with response.use() as arrays:
        assert arrays is response.arrays
    response.release()


async def test_the_history_records_spills_and_restores(setup: Any, tmp_path: Any) -> None:
    from aiocubie.stats import EventKind, render_history

    sim, mgr, cache, stage = setup
    mgr.record_history()
    response = await filled(mgr, cache, 1.0)
    big = await mgr.request(stage, stage_request(90_000))
    big.release()
    await check(response, 1.0)
    history = mgr.history()
    kinds = [e.kind for e in history.events]
    assert EventKind.SPILL in kinds and EventKind.RESTORE in kinds
    spill = next(e for e in history.events if e.kind is EventKind.SPILL)
    assert (spill.label, spill.nbytes, spill.group_live) == ("c", 200_000, 0)  # before the stage's allocation
    allocated = [e for e in history.events if e.kind is EventKind.ALLOCATE]
    assert [(e.label, e.nbytes) for e in allocated] == [("c", 200_000), ("x", 720_000), ("c", 200_000)]
    restore = next(e for e in history.events if e.kind is EventKind.RESTORE)
    assert (restore.nbytes, restore.detail) == (200_000, "c")
    assert history.series()["g"][1][-1] == 200_000
    out = render_history(history, tmp_path / "history.html")  # the page needs no matplotlib
    assert "spill, group g" in out.read_text()
    response.release()
    assert pinned(sim) == 0


async def test_arrays_written_in_use_during_a_spill_copy_are_not_lost(setup: Any) -> None:
    # a use() block that begins and ends while a spill copies the arrays: the copy may be stale, the spill
    # is called off (and made again later, from the new data)
    sim, mgr, cache, stage = setup
    response = await filled(mgr, cache, 1.0)
    gate = hold_stream(mgr.groups.stream(cache))
    try:
        async with anyio.create_task_group() as tg:

            async def stage_step() -> None:
                big = await mgr.request(stage, stage_request(90_000))
                assert big.chunks == 1
                big.release()

            tg.start_soon(stage_step)
            await wait_until(lambda: pinned(sim) == 200_000)  # the copy to host is queued, held
            async with response.use() as arrays:
                arrays["c"].set(np.full(N, 2.0))
            gate.set()
    finally:
        gate.set()
    await check(response, 2.0)
    assert mgr.stats().spill.spills == 1  # the second try, from the new data
    response.release()
    assert pinned(sim) == 0


async def test_a_release_during_a_spill_frees_the_blocks_after_its_copies(setup: Any) -> None:
    # the spill copies on the group's copy stream; a release meanwhile must not free the blocks under them
    # (the simulator turns a copy of freed memory into a sticky device error)
    sim, mgr, cache, stage = setup
    response = await filled(mgr, cache, 1.0)
    copy_stream = response._copy_streams()[1]
    gate = hold_stream(copy_stream)
    try:
        async with anyio.create_task_group() as tg:

            async def stage_step() -> None:
                big = await mgr.request(stage, stage_request(90_000))
                big.release()

            tg.start_soon(stage_step)
            await wait_until(lambda: pinned(sim) == 200_000)  # the copy to host is queued, held
            response.release()
            await anyio.sleep(0.01)  # a free that did not wait would land now
            gate.set()
    finally:
        gate.set()
    assert pinned(sim) == 0 and mgr.stats().live_bytes == 0 and mgr.statistics().spilled == 0
    again = await mgr.request(stage, stage_request(90_000))  # the device is still usable
    assert again.chunks == 1
    again.release()
