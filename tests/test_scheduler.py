"""Tests of the group schedulers through the manager, on the simulator, on asyncio and trio:
batching and lockstep plans, ready hooks, passive and active limits with each policy,
errors that fail whole batches, and cancellation at every stage with exact accounting.

Streams are held shut with gates where an order matters; ``fail_after`` only guards hangs.
"""

from __future__ import annotations

import math

import anyio
import pytest
from simkit import HANG_GUARD, TOTAL, Part, assert_all_released, hold_stream, vec, wait_until, warns_waits_on_itself

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.errors import (
    AllocationError,
    BackendError,
    InsufficientMemoryError,
    RunLengthMismatchError,
    UnchunkableTooLargeError,
)
from aiocubie.simulator import SimulatorBackend

HEADROOM = 0.05  # the manager's default
LONG_WINDOW = 10.0  # a batch window no passing test waits out


async def settle() -> None:
    """Give the schedulers time to act on what they have (nothing is asserted on time)."""
    await anyio.sleep(0.05)


def expected_plan(runs: int, bytes_per_run: int, fixed: int, offered: int) -> tuple[int, int]:
    """``(chunks, chunk_length)`` by the design's formula, to check the scheduler against."""
    if fixed + bytes_per_run * runs <= offered:
        return 1, runs
    max_chunk = (offered - fixed) // bytes_per_run
    chunks = math.ceil(runs / max_chunk)
    return chunks, math.ceil(runs / chunks)


class Asker:
    """Runs ``await mgr.request`` in a task and keeps the outcome."""

    def __init__(self, mgr: MemoryManager, part: Part, requests: dict[str, ArrayRequest]) -> None:
        self.mgr, self.part, self.requests = mgr, part, requests
        self.response: ArrayResponse | None = None
        self.error: BaseException | None = None
        self.done = anyio.Event()
        self.scope = anyio.CancelScope()

    async def __call__(self, order: list[Asker] | None = None) -> None:
        with self.scope:
            try:
                self.response = await self.mgr.request(self.part, self.requests)
            except Exception as exc:
                self.error = exc
            if order is not None:
                order.append(self)
        self.done.set()


# -- batching -------------------------------------------------------------------------------
STATE_RUNS = 10_000


def state_request() -> dict[str, ArrayRequest]:
    return {
        "state": ArrayRequest((4, STATE_RUNS), "float64", chunk_axis=1),
        "params": vec(100, unchunkable=True),
    }


@pytest.mark.anyio
async def test_one_lockstep_plan_for_a_batch_that_closes_when_all_asked(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, batch_window=LONG_WINDOW) as mgr:
        parts = [Part() for _ in range(3)]
        for part in parts:
            mgr.register(part, stream_group="solve")
        askers = [Asker(mgr, part, state_request()) for part in parts]
        with anyio.fail_after(LONG_WINDOW / 2):  # the batch must not wait out its window
            async with anyio.create_task_group() as tg:
                for asker in askers:
                    tg.start_soon(asker)
        # 3 x 320_000 state bytes + 3 x 800 params is over the 950_000 offered: chunked
        chunks, chunk_length = expected_plan(STATE_RUNS, 3 * 32, 3 * 800, int((1 - HEADROOM) * TOTAL))
        assert (chunks, chunk_length) == (2, 5000)
        for asker in askers:
            response = asker.response
            assert response is not None, asker.error
            assert (response.chunks, response.chunk_length, response.runs) == (chunks, chunk_length, STATE_RUNS)
            assert response.chunked_shapes == {"state": (4, chunk_length), "params": (100,)}
            assert response.arrays["state"].shape == (4, chunk_length)
            assert response.chunk_axes == {"state": 1, "params": None}
            assert response.stream is mgr.groups.stream(parts[0])
        assert len({id(a.response.arrays["state"]) for a in askers if a.response}) == 3
        assert sim.used == 3 * (4 * chunk_length * 8 + 800) == mgr.stats().live_bytes
        group = mgr.stats().groups["solve"]
        assert (group.requests, group.batches, group.chunks) == (3, 1, chunks)
        for asker in askers:
            assert asker.response is not None
            mgr.release(asker.response)
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_batch_with_a_member_missing_waits_for_flush(sim: SimulatorBackend) -> None:
    hooked: dict[str, ArrayResponse] = {}
    idle_hooked = anyio.Event()

    def idle_hook(response: ArrayResponse) -> None:
        hooked["idle"] = response
        idle_hooked.set()

    async with MemoryManager(sim, batch_window=LONG_WINDOW) as mgr:
        a, b, idle = Part(), Part(), Part()
        mgr.register(a, stream_group="g")
        mgr.register(b, stream_group="g")
        mgr.register(idle, stream_group="g", ready_hook=idle_hook)
        askers = [Asker(mgr, a, state_request()), Asker(mgr, b, state_request())]
        with anyio.fail_after(LONG_WINDOW / 2):
            async with anyio.create_task_group() as tg:
                for asker in askers:
                    tg.start_soon(asker)
                await settle()
                assert not any(asker.done.is_set() for asker in askers), "the batch closed early"
                assert sim.used == 0
                mgr.groups.flush("g")
            await idle_hooked.wait()
        first, second = (asker.response for asker in askers)
        assert first is not None and second is not None
        assert (first.chunks, first.chunk_length) == (second.chunks, second.chunk_length) == (1, STATE_RUNS)
        empty = hooked["idle"]
        assert empty.arrays == {} and empty.chunked_shapes == {}
        assert (empty.chunks, empty.chunk_length, empty.runs) == (1, STATE_RUNS, STATE_RUNS)
        assert empty.stream is mgr.groups.stream(idle)
        assert mgr.stats().groups["g"].batches == 1
        mgr.free_all()
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_batch_with_a_member_missing_closes_after_the_window(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, batch_window=0.05) as mgr:
        a, idle = Part(), Part()
        mgr.register(a, stream_group="g")
        mgr.register(idle, stream_group="g")
        with anyio.fail_after(HANG_GUARD):
            response = await mgr.request(a, {"x": vec(10)})
        assert response.arrays["x"].shape == (10,)
        mgr.release(response)
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_max_batch_splits_a_batch(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, batch_window=0.05, max_batch=2) as mgr:
        parts = [Part() for _ in range(5)]
        for part in parts:
            mgr.register(part, stream_group="g")
        askers = [Asker(mgr, part, {"x": vec(100)}) for part in parts]
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                for asker in askers:
                    tg.start_soon(asker)
        assert all(asker.response is not None for asker in askers)
        group = mgr.stats().groups["g"]
        assert (group.requests, group.batches) == (5, 3)
        mgr.free_all()
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_ready_hooks_sync_and_async_and_for_idle_members(sim: SimulatorBackend) -> None:
    seen: list[tuple[str, ArrayResponse]] = []
    all_seen = anyio.Event()

    def note(who: str, response: ArrayResponse) -> None:
        seen.append((who, response))
        if len(seen) == 3:
            all_seen.set()

    async def async_hook(response: ArrayResponse) -> None:
        await anyio.lowlevel.checkpoint()
        note("async", response)

    async with MemoryManager(sim, batch_window=0.01) as mgr:
        asker, other, idle = Part(), Part(), Part()
        mgr.register(asker, stream_group="g", ready_hook=lambda r: note("sync", r))
        mgr.register(other, stream_group="g", ready_hook=async_hook)
        mgr.register(idle, stream_group="g", ready_hook=lambda r: note("idle", r))
        outsider = Part()
        mgr.register(outsider, stream_group="elsewhere", ready_hook=lambda r: note("outsider", r))
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(Asker(mgr, asker, {"x": vec(8)}))
                tg.start_soon(Asker(mgr, other, {"y": vec(8)}))
            await all_seen.wait()
        by_who = dict(seen)
        assert set(by_who) == {"sync", "async", "idle"}, "hooks of other groups are not called"
        assert set(by_who["sync"].arrays) == {"x"} and set(by_who["async"].arrays) == {"y"}
        assert by_who["idle"].arrays == {} and by_who["idle"].chunk_length == 8
        mgr.free_all()
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_a_raising_hook_does_not_break_the_scheduler(sim: SimulatorBackend) -> None:
    calls: list[int] = []

    def broken(response: ArrayResponse) -> None:
        calls.append(len(response.arrays))
        raise RuntimeError("a bug in user code")

    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, ready_hook=broken)
        with anyio.fail_after(HANG_GUARD):
            for _ in range(3):
                async with mgr.request(part, {"x": vec(10)}) as response:
                    assert response.arrays["x"].shape == (10,)
            await wait_until(lambda: len(calls) == 3)
    assert calls == [1, 1, 1]
    assert_all_released(mgr, sim)


# -- groups in parallel -----------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_waiting_group_never_blocks_another(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", policy="wait") as mgr:
        small, other = Part(), Part()
        mgr.register(small, proportion=0.1, stream_group="small")  # cap 100_000
        mgr.register(other, stream_group="other")
        held = mgr.allocate(small, {"held": vec(10_000)})  # 80_000 of its cap
        waiting = Asker(mgr, small, {"x": vec(5_000)})  # 40_000: fits the cap, not what is left
        with anyio.fail_after(HANG_GUARD), warns_waits_on_itself():
            async with anyio.create_task_group() as tg:
                tg.start_soon(waiting)
                await wait_until(lambda: mgr.stats().groups["small"].requests == 1)
                for _ in range(3):
                    async with mgr.request(other, {"y": vec(1000)}) as response:
                        assert response.arrays["y"].shape == (1000,)
                assert not waiting.done.is_set()
                mgr.release(held)
        assert waiting.response is not None, waiting.error
        assert waiting.response.chunks == 1, "a waiting batch gets the plan it would have had on an empty group"
        mgr.release(waiting.response)
    assert_all_released(mgr, sim)


# -- passive and active limits ------------------------------------------------------------------
@pytest.mark.anyio
async def test_passive_chunks_only_when_the_device_is_short(sim: SimulatorBackend) -> None:
    # free_cache_seconds=0: another process takes memory between two requests, which a cached
    # free-memory reading would not see
    async with MemoryManager(sim, mode="passive", free_cache_seconds=0) as mgr:
        part = Part()
        mgr.register(part, proportion=0.1)  # a cap passive mode ignores
        request = {"x": vec(50_000)}  # 400_000 bytes: four times the cap
        async with mgr.request(part, request) as response:
            assert response.chunks == 1
        sim.occupy(700_000)
        async with mgr.request(part, request) as response:
            offered = int((1 - HEADROOM) * 300_000)
            assert (response.chunks, response.chunk_length) == expected_plan(50_000, 8, 0, offered) == (2, 25_000)
            assert sim.used == 25_000 * 8
        sim.occupy(-700_000)
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_a_large_batch_rereads_a_stale_free_memory_cache(sim: SimulatorBackend) -> None:
    # The default cache keeps a reading for 50 ms; another process takes memory inside that
    # time. A batch wanting over half of the cached free memory must read the device again
    # and chunk, rather than fail its allocation.
    async with MemoryManager(sim, mode="passive", free_cache_seconds=3600) as mgr:
        part = Part()
        mgr.register(part)
        async with mgr.request(part, {"x": vec(10)}):
            pass  # fills the cache with TOTAL free
        sim.occupy(700_000)
        async with mgr.request(part, {"x": vec(70_000)}) as response:  # 560 kB: over half of 1 MB
            offered = int((1 - HEADROOM) * 300_000)
            assert (response.chunks, response.chunk_length) == expected_plan(70_000, 8, 0, offered) == (2, 35_000)
        sim.occupy(-700_000)
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_active_limits_a_group_to_its_caps_minus_holdings(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", policy="chunk") as mgr:
        a, b = Part(), Part()
        mgr.register(a, proportion=0.06, stream_group="g")
        mgr.register(b, proportion=0.04, stream_group="g")  # group cap 100_000
        request = {"x": vec(50_000)}
        async with mgr.request(a, request) as response:
            assert (response.chunks, response.chunk_length) == expected_plan(50_000, 8, 0, 95_000) == (5, 10_000)
        held = mgr.allocate(b, {"held": vec(5_000)})  # b holds 40_000 of the group's cap
        async with mgr.request(a, request) as response:
            offered = int((1 - HEADROOM) * 60_000)
            assert (response.chunks, response.chunk_length) == expected_plan(50_000, 8, 0, offered) == (8, 6_250)
        mgr.release(held)
        mgr.budget.set_mode("passive")
        async with mgr.request(a, request) as response:
            assert response.chunks == 1
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_policy_fail_raises_when_the_batch_does_not_fit_whole(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", policy="fail") as mgr:
        part = Part()
        mgr.register(part, proportion=0.1)
        with pytest.raises(InsufficientMemoryError, match="policy 'fail'"):
            await mgr.request(part, {"x": vec(50_000)})
        assert_all_released(mgr, sim)
        async with mgr.request(part, {"x": vec(10_000)}) as response:  # 80_000 fits 95_000
            assert response.chunks == 1
        assert mgr.stats().groups["default"].failures == 1
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_policy_wait_is_first_come_first_served(sim: SimulatorBackend) -> None:
    resolved: list[tuple[int, ...]] = []  # in the order the scheduler resolves them
    async with MemoryManager(sim, mode="active", policy="wait", batch_window=0) as mgr:
        part = Part()
        mgr.register(part, proportion=0.1, ready_hook=lambda r: resolved.append(r.chunked_shapes["x"]))
        held = mgr.allocate(part, {"held": vec(10_000)})  # 80_000 of a 100_000 cap
        big = Asker(mgr, part, {"x": vec(5_000)})  # must wait for the release
        small = Asker(mgr, part, {"x": vec(100)})  # would fit now, but asked later
        order: list[Asker] = []
        with anyio.fail_after(HANG_GUARD), warns_waits_on_itself():
            async with anyio.create_task_group() as tg:
                tg.start_soon(big, order)
                await wait_until(lambda: mgr.stats().groups["default"].requests == 1)
                await settle()
                tg.start_soon(small, order)
                await settle()
                assert order == [] and sim.used == 80_000, "nothing may overtake the waiting batch"
                mgr.release(held)
        # resolved first come, first served; the tasks themselves may resume in either order
        # when both batches complete in one loop tick (trio shuffles the tasks it wakes)
        assert resolved == [(5_000,), (100,)] and set(order) == {big, small}
        assert big.response is not None and big.response.chunks == 1
        assert small.response is not None
        mgr.free_all()
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_policy_wait_fails_what_could_never_fit(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", policy="wait") as mgr:
        part = Part()
        mgr.register(part, proportion=0.1)
        with anyio.fail_after(HANG_GUARD):
            with pytest.raises(UnchunkableTooLargeError):
                await mgr.request(part, {"x": vec(20_000, unchunkable=True)})  # 160_000 > the cap
            async with mgr.request(part, {"x": vec(20_000)}) as response:  # chunkable: chunked
                assert response.chunks == 2
    assert_all_released(mgr, sim)


# -- errors -----------------------------------------------------------------------------------
async def ask_together(mgr: MemoryManager, asks: list[tuple[Part, dict[str, ArrayRequest]]]) -> list[Asker]:
    askers = [Asker(mgr, part, requests) for part, requests in asks]
    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            for asker in askers:
                tg.start_soon(asker)
    return askers


@pytest.mark.anyio
async def test_an_unplannable_batch_shrinks_and_a_request_fails_alone(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, batch_window=LONG_WINDOW) as mgr:
        a, b = Part(), Part()
        mgr.register(a, stream_group="g")
        mgr.register(b, stream_group="g")
        lut = {"lut": vec(75_000, unchunkable=True)}  # 600_000 bytes: fits alone, not twice
        for big in (lut, {"lut": vec(150_000, unchunkable=True)}):  # b's second: too large even alone
            askers = await ask_together(mgr, [(a, lut), (b, big)])
            # the batch shrinks to its head (whichever task submitted first: trio shuffles them);
            # the next batch cannot fit while the head holds its LUT, and fails alone
            served = [asker.response for asker in askers if asker.response is not None]
            assert len(served) == 1 and sum(isinstance(x.error, UnchunkableTooLargeError) for x in askers) == 1
            mgr.release(served[0])

        batches = mgr.stats().groups["g"].batches
        askers = await ask_together(mgr, [(a, {"x": vec(100)}), (b, {"x": vec(200)})])
        # one plan walks one run axis: the other length is served by the next batch, not failed
        assert [asker.response.runs for asker in askers if asker.response] == [100, 200]
        assert mgr.stats().groups["g"].batches == batches + 2
        assert mgr.stats().groups["g"].failures == 2
        for asker in askers:
            assert asker.response is not None
            mgr.release(asker.response)
        assert_all_released(mgr, sim)

        askers = await ask_together(mgr, [(a, {"x": vec(100)}), (b, {"x": vec(100)})])  # still served
        assert all(asker.response is not None for asker in askers)
        mgr.free_all()
    assert_all_released(mgr, sim)


def test_a_request_disagreeing_on_run_length_raises_at_once(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    part = Part()
    mgr.register(part)
    with pytest.raises(RunLengthMismatchError, match="'a' has 10 runs"):
        mgr.request(part, {"a": vec(10), "b": vec(20)})


@pytest.mark.anyio
@pytest.mark.parametrize(("site", "error"), [("allocate", AllocationError), ("record_event", BackendError)])
async def test_a_device_fault_part_way_releases_the_whole_batch(
    sim: SimulatorBackend, site: str, error: type[Exception]
) -> None:
    async with MemoryManager(sim, batch_window=LONG_WINDOW) as mgr:
        parts = [Part() for _ in range(3)]
        for part in parts:
            mgr.register(part, stream_group="g")
        held = mgr.allocate(parts[0], {"held": vec(125)})
        sim.faults.inject(site, after=4 if site == "allocate" else 0)  # type: ignore[arg-type]
        two = {"x": vec(100), "y": vec(100, "int32")}
        askers = await ask_together(mgr, [(part, two) for part in parts])
        assert all(isinstance(asker.error, error) for asker in askers), [a.error for a in askers]
        assert sim.faults.fired[site] == 1
        assert sim.used == 1000 and mgr.stats().live_bytes == 1000
        assert mgr.stats().groups["g"].failures == 3

        askers = await ask_together(mgr, [(part, two) for part in parts])
        assert all(asker.response is not None for asker in askers)
        mgr.release(held)
        mgr.free_all()
    assert_all_released(mgr, sim)


# -- cancellation -----------------------------------------------------------------------------
@pytest.mark.anyio
async def test_cancelled_while_queued_is_withdrawn(sim: SimulatorBackend) -> None:
    hooked: list[ArrayResponse] = []
    async with MemoryManager(sim, batch_window=LONG_WINDOW) as mgr:
        quitter, stayer = Part(), Part()
        mgr.register(quitter, stream_group="g", ready_hook=hooked.append, name="quitter")
        mgr.register(stayer, stream_group="g", name="stayer")
        gone = Asker(mgr, quitter, {"x": vec(1000)})
        with anyio.fail_after(LONG_WINDOW / 2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(gone)
                await wait_until(lambda: mgr.stats().groups["g"].requests == 1)
                gone.scope.cancel()
            assert gone.response is None and gone.error is None
            assert sim.used == 0
            assert mgr.stats().instances["quitter"].cancellations == 1
            stays = Asker(mgr, stayer, {"x": vec(10)})
            async with anyio.create_task_group() as tg:
                tg.start_soon(stays)
                await wait_until(lambda: mgr.stats().groups["g"].requests == 2)
                mgr.groups.flush("g")
            await wait_until(lambda: len(hooked) == 1)
        assert stays.response is not None and stays.response.chunk_length == 10
        assert hooked[0].arrays == {}, "the withdrawn request took no part in the batch"
        assert sim.used == 80 == mgr.stats().live_bytes
        mgr.release(stays.response)
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_cancelled_while_waiting_for_memory(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", policy="wait") as mgr:
        part = Part()
        mgr.register(part, proportion=0.1, name="p")
        held = mgr.allocate(part, {"held": vec(10_000)})
        waiting = Asker(mgr, part, {"x": vec(5_000)})
        with anyio.fail_after(HANG_GUARD):
            with warns_waits_on_itself():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiting)
                    await wait_until(lambda: mgr.stats().groups["default"].requests == 1)
                    await settle()
                    waiting.scope.cancel()
            assert waiting.response is None and sim.used == 80_000
            mgr.release(held)
            assert_all_released(mgr, sim)
            async with mgr.request(part, {"x": vec(5_000)}) as response:  # the group is not stuck
                assert response.chunks == 1
        assert mgr.stats().instances["p"].cancellations == 1
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_cancelled_while_allocated_is_freed_when_the_batch_resolves(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, name="p")
        gate = hold_stream(mgr.groups.stream(part))
        asker = Asker(mgr, part, {"x": vec(1000)})
        try:
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(asker)
                    await wait_until(lambda: sim.used == 8000)
                    asker.scope.cancel()
                await asker.done.wait()
                # the device may still write to the arrays: they are freed once it is done
                assert sim.used == 8000
                gate.set()
                await wait_until(lambda: sim.used == 0)
        finally:
            gate.set()
        assert asker.response is None
        assert mgr.stats().instances["p"].cancellations == 1
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_cancelled_with_device_latency() -> None:
    slow = SimulatorBackend(total=TOTAL, latency=0.05)
    try:
        async with MemoryManager(slow) as mgr:
            parts = [Part() for _ in range(3)]
            for part in parts:
                mgr.register(part, stream_group="g")
            askers = [Asker(mgr, part, {"x": vec(1000, zero=True)}) for part in parts]
            gate = hold_stream(mgr.groups.stream(parts[0]))  # so that the cancel lands before the device is done
            try:
                with anyio.fail_after(HANG_GUARD):
                    async with anyio.create_task_group() as tg:
                        for asker in askers:
                            tg.start_soon(asker)
                        await wait_until(lambda: slow.used == 3 * 8000)
                        askers[0].scope.cancel()
                        gate.set()
            finally:
                gate.set()
            with anyio.fail_after(HANG_GUARD):
                kept = [a.response for a in askers[1:]]
                assert all(r is not None for r in kept)
                await wait_until(lambda: slow.used == 2 * 8000)
            for response in kept:
                assert response is not None
                assert not response.arrays["x"].any()
                mgr.release(response)
            assert_all_released(mgr, slow)
    finally:
        slow.close()


@pytest.mark.anyio
async def test_cancelled_after_ready_before_resuming(sim: SimulatorBackend) -> None:
    askers: list[Asker] = []

    def cancel_the_asker(response: ArrayResponse) -> None:
        # runs right after the request was resolved, before its task has resumed
        askers[0].scope.cancel()

    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, ready_hook=cancel_the_asker)
        askers.append(Asker(mgr, part, {"x": vec(1000)}))
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(askers[0])
        # either outcome is allowed: cancelled (then nothing may stay allocated) or served
        response = askers[0].response
        if response is None:
            assert_all_released(mgr, sim)
        else:
            assert sim.used == 8000
            mgr.release(response)
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_cancelled_inside_async_with_frees(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        with anyio.CancelScope() as scope:
            async with mgr.request(part, {"x": vec(1000)}):
                assert sim.used == 8000
                scope.cancel()
                await anyio.sleep_forever()
        assert scope.cancelled_caught
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_mass_cancellation_returns_accounting_to_zero() -> None:
    slow = SimulatorBackend(total=TOTAL, latency=0.001)
    try:
        async with MemoryManager(slow, batch_window=0.001) as mgr:
            parts = [Part() for _ in range(8)]
            for i, part in enumerate(parts):
                mgr.register(part, stream_group=f"g{i % 2}")
            kept: list[ArrayResponse] = []

            async def one(i: int) -> None:
                # cancelled at varied points: queued, allocated, or not at all
                with anyio.move_on_after(0.001 * (i % 7)):
                    kept.append(await mgr.request(parts[i % 8], {"x": vec(64)}))

            with anyio.fail_after(HANG_GUARD * 3):
                async with anyio.create_task_group() as tg:
                    for i in range(300):
                        tg.start_soon(one, i)
                for response in kept:
                    mgr.release(response)
                await wait_until(lambda: slow.used == 0)
            stats = mgr.stats()
            groups = stats.groups.values()
            assert sum(g.requests for g in groups) == 300
            assert sum(g.cancellations for g in groups) == 300 - len(kept)
            assert_all_released(mgr, slow)
    finally:
        slow.close()


@pytest.mark.anyio
async def test_a_flush_with_nothing_queued_does_not_cut_the_next_window(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, batch_window=0.3) as mgr:
        a, b, c = Part(), Part(), Part()
        for part in (a, b, c):  # c never asks: the batch closes on the window
            mgr.register(part, stream_group="g")
        mgr.groups.flush("g")
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(Asker(mgr, a, {"x": vec(8)}))
                await anyio.sleep(0.02)
                tg.start_soon(Asker(mgr, b, {"x": vec(8)}))
        assert mgr.stats().groups["g"].batches == 1
        mgr.free_all()


@pytest.mark.anyio
async def test_an_allocation_failing_on_a_stale_reading_is_planned_again(sim: SimulatorBackend) -> None:
    # Under half of the cached free memory: planned from the cache, which is stale; the
    # allocation fails, the device is read again, and the batch is chunked instead of failing.
    async with MemoryManager(sim, mode="passive", free_cache_seconds=3600) as mgr:
        part = Part()
        mgr.register(part)
        async with mgr.request(part, {"x": vec(10)}):
            pass  # fills the cache with TOTAL free
        sim.occupy(900_000)
        async with mgr.request(part, {"x": vec(50_000)}) as response:  # 400 kB of 100 kB free
            offered = int((1 - HEADROOM) * 100_000)
            assert (response.chunks, response.chunk_length) == expected_plan(50_000, 8, 0, offered)
        sim.occupy(-900_000)
    assert_all_released(mgr, sim)
