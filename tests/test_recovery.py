"""Out-of-memory recovery, in order: the pool's cached blocks, then reclaim hooks, then an error with the summary.

Real out-of-memory on the simulator (a pool of cached blocks, another process taking memory
after the last reading) and injected ones (the "oom" fault site), on asyncio and trio.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest
from simkit import TOTAL, Part, vec

from aiocubie import ArrayResponse, MemoryManager
from aiocubie.errors import ConfigurationError, OutOfMemoryError, RegistrationError
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import EventKind, History

pytestmark = pytest.mark.anyio


@pytest.fixture
def pooled() -> Iterator[SimulatorBackend]:
    """The simulator with CuPy's pool model: freed device blocks stay cached."""
    backend = SimulatorBackend(total=TOTAL, allocator="cupy")
    yield backend
    backend.close()


async def test_cached_blocks_are_freed_first_and_the_allocation_goes_on(
    pooled: SimulatorBackend, caplog: pytest.LogCaptureFixture
) -> None:
    hook_calls: list[int] = []
    async with MemoryManager(pooled) as mgr:
        mgr.pool.add_reclaim_hook(lambda n: hook_calls.append(n) or 0)
        part = Part()
        mgr.register(part, stream_group="g")
        for _ in range(10):  # ten 50 kB blocks end up cached in the pool
            mgr.allocate(part, {"x": vec(50_000 // 8)})
        mgr.free_all()
        gc.collect()  # an array in a reference cycle holds its block until collected, as on a GPU
        assert mgr.stats().pool.cached == 500_000
        pooled.occupy(400_000)  # another process: 100 kB stay free on the device
        mgr.record_history()
        with caplog.at_level(logging.WARNING, logger="aiocubie"):
            async with mgr.request(part, {"x": vec(200_000 // 8)}) as response:  # larger than any cached block
                assert response.arrays["x"].shape == (25_000,)
        stats = mgr.stats()
    assert hook_calls == []
    recovery = stats.recovery
    assert (recovery.out_of_memory, recovery.cache_releases, recovery.cache_bytes_freed) == (1, 1, 500_000)
    assert (recovery.hook_calls, recovery.recovered, recovery.failed) == (0, 1, 0)
    assert [e.kind for e in mgr.history().events][:3] == [EventKind.PLAN, EventKind.RECOVERY, EventKind.ALLOCATE]
    messages = [r.getMessage() for r in caplog.records]
    assert "freeing the pool's cached blocks" in messages[0] and "recovered" in messages[1]


class Spiller:
    """Holds a response it gives up when asked to reclaim; notes what it saw."""

    def __init__(self, mgr: MemoryManager, sim: SimulatorBackend) -> None:
        self.mgr, self.sim = mgr, sim
        self.held: ArrayResponse | None = None
        self.calls: list[tuple[int, list[int]]] = []

    def reclaim(self, nbytes: int) -> int | None:
        self.calls.append((nbytes, list(self.sim.cached)))
        if self.held is None:
            return None
        self.mgr.release(self.held)
        self.held = None
        return 300_000


async def test_reclaim_hooks_run_after_the_cache_and_the_allocation_goes_on(pooled: SimulatorBackend) -> None:
    async with MemoryManager(pooled, free_cache_seconds=3600) as mgr:  # the reading stays cached
        spiller = Spiller(mgr, pooled)
        mgr.register(spiller, stream_group="spill")
        part = Part()
        mgr.register(part, stream_group="g", name="worker")
        spiller.held = mgr.allocate(spiller, {"table": vec(300_000 // 8)})
        broken: list[int] = []

        def raises(nbytes: int) -> int:
            broken.append(nbytes)
            raise RuntimeError("a broken hook")

        async def awaitable(nbytes: int) -> int:  # awaited before a batch that does not fit whole, not here
            broken.append(-nbytes)
            return 0

        mgr.pool.add_reclaim_hook(raises)
        mgr.pool.add_reclaim_hook(awaitable)
        mgr.pool.add_reclaim_hook(spiller.reclaim)
        pooled.occupy(600_000)  # unseen: the manager plans on its last reading
        mgr.record_history()
        async with mgr.request(part, {"x": vec(250_000 // 8)}) as response:
            assert response.chunks == 1
        recovery = mgr.stats().recovery
        events = mgr.history().events
    assert broken == [250_000] and spiller.calls == [(250_000, [])]  # the cache was empty by then
    assert (recovery.out_of_memory, recovery.cache_releases, recovery.hook_calls) == (1, 1, 2)
    assert (recovery.hook_bytes_freed, recovery.recovered, recovery.failed) == (300_000, 1, 0)
    steps = [e.detail for e in events if e.kind is EventKind.RECOVERY]
    assert steps[0] == "released the pool's cached blocks" and "Spiller.reclaim" in steps[-1]
    assert [e.kind for e in events if e.kind is not EventKind.RECOVERY] == [
        EventKind.PLAN,
        EventKind.RELEASE,  # the hook's release, inside the recovery
        EventKind.ALLOCATE,
        EventKind.QUEUED,
        EventKind.READY,
        EventKind.RELEASE,
    ]


async def test_out_of_memory_after_every_step_says_what_each_group_holds(sim: SimulatorBackend, tmp_path: Path) -> None:
    async with MemoryManager(sim) as mgr:
        mgr.record_history(dump_on_oom=tmp_path / "oom.json")
        a, b = Part(), Part()
        mgr.register(a, stream_group="solve")
        mgr.register(b, stream_group="load")
        held = await mgr.request(b, {"y": vec(20_000)})
        mgr.pool.add_reclaim_hook(lambda nbytes: None)
        sim.faults.inject("oom", times=3)  # the try, the retry after the cache, the retry after the hooks
        with pytest.raises(OutOfMemoryError) as info:
            await mgr.request(a, {"x": vec(1000)})
        recovery = mgr.stats().recovery
        mgr.release(held)
        async with mgr.request(a, {"x": vec(1000)}):  # the device is fine again
            pass
    message = str(info.value)
    assert "group 'solve' asked for 7.8 KiB (1 request(s), 1 chunk(s) of 1000 runs)" in message
    assert "calling 1 reclaim hook(s) did not make room" in message
    assert "Held through this manager: 'load' 156.2 KiB" in message and "mgr.pool.add_reclaim_hook" in message
    assert "injected out of memory" in message
    assert (recovery.out_of_memory, recovery.cache_releases, recovery.hook_calls, recovery.failed) == (1, 1, 1, 1)
    assert recovery.recovered == 0
    dumped = History.load(tmp_path / "oom.json")
    assert dumped.events[-1].kind is EventKind.FAILURE and "OutOfMemoryError" in dumped.events[-1].detail
    assert [e.kind for e in mgr.history().events].count(EventKind.FAILURE) == 1


async def test_an_injected_allocation_fault_is_not_out_of_memory(sim: SimulatorBackend) -> None:
    calls: list[int] = []
    async with MemoryManager(sim) as mgr:
        mgr.pool.add_reclaim_hook(calls.append)  # type: ignore[arg-type]
        part = Part()
        mgr.register(part)
        sim.faults.inject("allocate")
        with pytest.raises(Exception, match="injected fault"):
            await mgr.request(part, {"x": vec(10)})
        assert mgr.stats().recovery.out_of_memory == 0 and calls == []


async def test_one_recovery_step_each_for_injected_out_of_memory(sim: SimulatorBackend) -> None:
    calls: list[int] = []
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)

        def hook(nbytes: int) -> int:
            calls.append(nbytes)
            return 0

        mgr.pool.add_reclaim_hook(hook)
        sim.faults.inject("oom", times=1)  # the cache release is enough
        async with mgr.request(part, {"x": vec(10)}):
            pass
        assert calls == []
        sim.faults.inject("oom", times=2)  # the hooks are needed
        async with mgr.request(part, {"x": vec(10)}):
            pass
        assert calls == [80]
        mgr.pool.remove_reclaim_hook(hook)
        mgr.pool.remove_reclaim_hook(print)  # not added: nothing happens
        sim.faults.inject("oom", times=2)
        with pytest.raises(OutOfMemoryError, match="calling 0 reclaim hook"):  # no hooks: no third try
            await mgr.request(part, {"x": vec(10)})
        assert calls == [80]
        recovery = mgr.stats().recovery
    assert (recovery.out_of_memory, recovery.cache_releases, recovery.hook_calls) == (3, 3, 1)
    assert (recovery.recovered, recovery.failed) == (2, 1)


def test_a_reclaim_hook_must_be_callable() -> None:
    mgr = MemoryManager(SimulatorBackend(TOTAL))
    with pytest.raises(ConfigurationError, match="callable"):
        mgr.pool.add_reclaim_hook(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("action", ["unregister", "change_stream_group"])
async def test_a_reclaim_hook_that_unregisters_or_moves_a_member_of_the_batch_leaks_nothing(
    sim: SimulatorBackend, action: str
) -> None:
    # the hook runs while the batch is allocated: the member's request leaves it (failed, or
    # served by its new group), and what the retry gave it must not stay held by no one
    async with MemoryManager(sim, batch_window=0.05) as mgr:
        a, c = Part(), Part()
        mgr.register(a, stream_group="g")
        mgr.register(c, stream_group="g")

        def hook(nbytes: int) -> int:
            if action == "unregister":
                mgr.unregister(c)
            else:
                mgr.groups.move(c, "h")
            return 0

        mgr.pool.add_reclaim_hook(hook)
        sim.faults.inject("oom", times=2)  # the batch of both requests needs the hooks
        outcomes: dict[str, object] = {}

        async def ask(name: str, part: Part) -> None:
            try:
                outcomes[name] = await mgr.request(part, {"x": vec(100)})
            except Exception as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "a", a)
            tg.start_soon(ask, "c", c)
        assert isinstance(outcomes["a"], ArrayResponse)
        stats = mgr.stats()
        if action == "unregister":
            assert isinstance(outcomes["c"], RegistrationError)
            assert stats.live_bytes == sim.used == 800  # a's array alone
            assert stats.groups["g"].live_bytes == 800
        else:
            assert isinstance(outcomes["c"], ArrayResponse)
            assert stats.live_bytes == sim.used == 1600
            assert stats.groups["g"].live_bytes == stats.groups["h"].live_bytes == 800
        mgr.free_all()
        assert mgr.stats().live_bytes == sim.used == 0


async def test_an_unwritable_dump_on_oom_still_raises_out_of_memory(
    sim: SimulatorBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        mgr.record_history(dump_on_oom=tmp_path / "no such folder" / "oom.json")
        sim.faults.inject("oom", times=3)
        with caplog.at_level(logging.ERROR, logger="aiocubie"):
            with pytest.raises(OutOfMemoryError, match="did not make room"):
                await mgr.request(part, {"x": vec(10)})
    assert any("could not write the allocation history" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("bad", [3, 2.5, b"oom.json"])
def test_dump_on_oom_must_be_a_path(bad: object) -> None:
    mgr = MemoryManager(SimulatorBackend(TOTAL))
    with pytest.raises(ConfigurationError, match="dump_on_oom"):
        mgr.record_history(dump_on_oom=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("said", "counted"),
    [(None, 0), (True, 0), (1.5e6, 0), (-5, 0), (np.int64(4096), 4096), (10**30, "total")],
)
async def test_what_a_hook_says_it_freed_is_counted_as_whole_bytes_up_to_the_device(
    sim: SimulatorBackend, said: object, counted: object
) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        mgr.pool.add_reclaim_hook(lambda nbytes: said)  # type: ignore[arg-type,return-value]
        sim.faults.inject("oom", times=2)  # the try and the retry after the cache: the hook's retry succeeds
        async with mgr.request(part, {"x": vec(100)}):
            pass
        recovery = mgr.stats().recovery
    want = sim.device.memory_info().total if counted == "total" else counted
    assert (recovery.hook_calls, recovery.hook_bytes_freed, recovery.recovered) == (1, want, 1)
