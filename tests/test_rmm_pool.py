"""One pool for every library (issue 23) on the simulator: the ``rmm`` model, other libraries' bytes, their recovery.

The simulator's ``rmm`` resource models RMM's current device resource: other libraries' allocations
(``SimulatorBackend.library_allocate``, as CuPy, numba and torch through RMM's hooks) draw from the
same pool, count in its facts and, out of memory, run the manager's reclaim hooks first. The GPU side
is tests/gpu/test_rmm_gpu.py.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Iterator

import anyio
import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryKind, MemoryManager, mr
from aiocubie.errors import (
    AiocubieWarning,
    ConfigurationError,
    InsufficientMemoryError,
    ManagerStateError,
    OutOfMemoryError,
    RegistrationError,
    UnknownAllocatorError,
)
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

KiB = 1 << 10
TOTAL = 1 << 20


class Part:
    """A registered component."""


@pytest.fixture
def shared() -> Iterator[SimulatorBackend]:
    backend = SimulatorBackend(TOTAL, allocator="rmm")
    yield backend
    backend.close()


def _floats(n: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest(shape=(n,), dtype=np.float32)}


async def test_other_libraries_bytes_show_in_stats_to_the_byte(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    async with mgr:
        await mgr.request(part, _floats(1000))
        theirs = [shared.library_allocate(n) for n in (3000, 777)]
        stats = mgr.stats()
        assert stats.live_bytes == 4000
        assert stats.other_bytes == 3777
        assert stats.pool.in_use == stats.live_bytes + stats.other_bytes
        assert "held by other libraries" in mgr.summary()
        shared.library_free(theirs.pop())
        assert mgr.stats().other_bytes == 3000
        mgr.free_all()
        assert mgr.stats().other_bytes == 3000 and mgr.stats().pool.in_use == 3000


async def test_managed_and_host_memory_are_not_pool_bytes(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    async with mgr:
        await mgr.request(
            part,
            {
                "d": ArrayRequest(shape=(100,), dtype=np.float64),
                "m": ArrayRequest(shape=(100,), dtype=np.float64, kind=MemoryKind.MANAGED),
                "p": ArrayRequest(shape=(100,), dtype=np.float64, kind=MemoryKind.PINNED),
            },
        )
        stats = mgr.stats()
        assert stats.pool.in_use == 800 and stats.other_bytes == 0


async def test_plans_count_other_libraries_bytes_as_used(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared, headroom=0.0), Part()
    mgr.register(part)
    theirs = shared.library_allocate(600 * KiB)
    async with mgr:
        request = {"x": ArrayRequest(shape=(4, 50_000), dtype=np.float32, chunk_axis=1)}  # 800 KB
        response = await mgr.request(part, request)
        assert response.chunks > 1
    shared.library_free(theirs)


async def test_a_library_out_of_memory_runs_the_reclaim_hooks_and_goes_on(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    asked: list[int] = []

    def reclaim(nbytes: int) -> int:
        asked.append(nbytes)
        held = mgr.stats().live_bytes
        mgr.free_all()
        return held

    mgr.pool.add_reclaim_hook(reclaim)
    async with mgr:
        await mgr.request(part, _floats(100_000))  # 400 KB held by the manager
        block = shared.library_allocate(800 * KiB)  # fits only once the manager's arrays are gone
        assert asked == [800 * KiB]
        recovery = mgr.stats().recovery
        assert recovery.out_of_memory == 1 and recovery.hook_calls == 1 and recovery.hook_bytes_freed == 400_000
        assert mgr.stats().other_bytes == 800 * KiB and mgr.stats().live_bytes == 0
        shared.library_free(block)


async def test_a_library_out_of_memory_that_nothing_frees_is_its_own_error(shared: SimulatorBackend) -> None:
    mgr = MemoryManager(shared)
    mgr.pool.add_reclaim_hook(lambda nbytes: 0)
    async with mgr:
        with pytest.raises(OutOfMemoryError):
            shared.library_allocate(2 * TOTAL)
        assert mgr.stats().recovery.failed == 1


async def test_hooks_never_run_for_a_library_in_another_thread(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    called: list[int] = []
    mgr.pool.add_reclaim_hook(lambda nbytes: called.append(nbytes) or 1)
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            shared.library_allocate(2 * TOTAL)
        except OutOfMemoryError as exc:
            errors.append(exc)

    async with mgr:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert called == [] and len(errors) == 1


async def test_set_allocator_detaches_the_recovery_from_the_shared_pool(shared: SimulatorBackend) -> None:
    mgr = MemoryManager(shared)
    called: list[int] = []
    mgr.pool.add_reclaim_hook(lambda nbytes: called.append(nbytes) or 1)
    with pytest.warns(UserWarning, match="resets the device context"):
        mgr.pool.set_allocator("cupy")
    with pytest.raises(OutOfMemoryError):
        shared.library_allocate(2 * TOTAL)
    assert called == []


def test_share_pool_needs_the_rmm_allocator() -> None:
    mgr = MemoryManager(SimulatorBackend(TOTAL, allocator="cupy"))
    with pytest.raises(ConfigurationError, match=r"allocator='rmm'.*aiocubie\[rmm\]"):
        mgr.pool.share("cupy")
    shared = MemoryManager(SimulatorBackend(TOTAL, allocator="rmm"))
    shared.pool.share("cupy", "numba", "torch")
    with pytest.raises(ConfigurationError, match="'jax'.*'cupy', 'numba', 'torch'"):
        shared.pool.share("jax")


def test_rmm_is_a_known_allocator_name() -> None:
    assert MemoryManager(SimulatorBackend(TOTAL), allocator="rmm").pool.allocator == "rmm"
    with pytest.raises(UnknownAllocatorError, match="'rmm'"):
        MemoryManager(SimulatorBackend(TOTAL), allocator="rmmm")


def test_a_hard_cap_inside_the_allocator_refuses_what_is_over_it(shared: SimulatorBackend) -> None:
    capped = mr.LimitingAdaptor(shared.resource, 1000)  # over any resource: RMM's LimitingResourceAdaptor
    first = capped.allocate(600, MemoryKind.DEVICE, None)
    with pytest.raises(OutOfMemoryError, match="limit of 1000"):
        capped.allocate(600, MemoryKind.DEVICE, None)
    assert capped.held == 600 == capped.pool_facts().in_use
    capped.deallocate(first)
    capped.deallocate(capped.allocate(1000, MemoryKind.DEVICE, None))
    assert capped.held == 0


def test_without_rmm_installed_the_rmm_allocator_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cuda.core", reason="the CUDA backend's modules need cuda-core")
    from aiocubie._backends._cuda._rmm import import_rmm

    monkeypatch.setitem(sys.modules, "rmm", None)  # makes `import rmm` fail
    with pytest.raises(UnknownAllocatorError, match=r'pip install "aiocubie\[rmm\]"'):
        import_rmm()


# -- torch allocations that count (the simulator's model of torch's MemPool on the shared pool) ---


async def test_torch_allocations_count_against_the_instance(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part, stream_group="model")
    async with mgr:
        await mgr.request(part, _floats(1000))
        with mgr.pool.torch_allocations(part) as scope:
            tensors = [shared.library_allocate(5000), shared.library_allocate(3000)]
        outside = shared.library_allocate(100)  # not in the block: another library's
        stats = mgr.stats()
        assert scope.held == 8000
        assert stats.instances["Part#1"].live_bytes == 4000 + 8000
        assert stats.groups["model"].live_bytes == 12_000 and stats.live_bytes == 12_000
        assert stats.other_bytes == 100 and stats.pool.in_use == 12_100  # every byte, once
        shared.library_free(tensors.pop())
        with mgr.pool.torch_allocations(part):
            pass  # the count is refreshed when a block ends
        assert mgr.stats().instances["Part#1"].live_bytes == 4000 + 5000
        assert mgr.stats().instances["Part#1"].peak_bytes == 12_000
        shared.library_free(outside)


async def test_torch_bytes_are_in_the_history(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    mgr.record_history()
    with mgr.pool.torch_allocations(part):
        block = shared.library_allocate(2000)
    with mgr.pool.torch_allocations(part):
        shared.library_free(block)
    events = [(e.kind.value, e.label, e.nbytes, e.instance_live) for e in mgr.history().events]
    assert events == [("allocate", "torch", 2000, 2000), ("release", "torch", 2000, 0)]


async def test_torch_bytes_take_the_groups_headroom_in_active_mode(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared, mode="active", policy="fail", headroom=0.0), Part()
    mgr.register(part, proportion=0.5)  # a 512 KiB cap
    async with mgr:
        request = {"x": ArrayRequest(shape=(50_000,), dtype=np.float32, unchunkable=True)}  # 200 KB
        async with mgr.request(part, request):
            pass  # fits while torch holds nothing
        with mgr.pool.torch_allocations(part):
            shared.library_allocate(400 * KiB)
        with pytest.raises(InsufficientMemoryError):
            await mgr.request(part, request)


async def test_torch_allocations_stop_counting_when_the_instance_leaves(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    with mgr.pool.torch_allocations(part):
        shared.library_allocate(2000)
    assert mgr.stats().live_bytes == 2000
    mgr.unregister(part)
    stats = mgr.stats()
    assert stats.live_bytes == 0 and stats.other_bytes == 2000  # torch still holds them: another library's now


async def test_torch_allocations_refuse_async_with_and_warn_when_the_block_awaited(
    shared: SimulatorBackend, anyio_backend: str
) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    with pytest.raises(ManagerStateError, match="nothing inside may await"):
        async with mgr.pool.torch_allocations(part):  # type: ignore[attr-defined]
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with mgr.pool.torch_allocations(part):
            pass  # synchronous: no warning
    if anyio_backend == "trio":
        return  # the awaiting block is noticed on asyncio only (see aiocubie._libraries._loop_ran)
    with pytest.warns(AiocubieWarning, match="torch_allocations block awaited"):
        with mgr.pool.torch_allocations(part):
            await anyio.sleep(0)


def test_torch_allocations_need_a_pool_torch_can_draw_from() -> None:
    mgr, part = MemoryManager(SimulatorBackend(TOTAL, allocator="driver")), Part()
    mgr.register(part)
    with pytest.raises(ConfigurationError, match=r'allocator="rmm"'):
        mgr.pool.torch_allocations(part)
    with pytest.raises(RegistrationError):
        MemoryManager(SimulatorBackend(TOTAL, allocator="rmm")).pool.torch_allocations(Part())


def test_the_shared_pool_does_not_keep_a_manager_alive() -> None:
    import gc
    import weakref

    backend = SimulatorBackend(TOTAL, allocator="rmm")
    mgr = MemoryManager(backend)
    gone = [weakref.ref(mgr), weakref.ref(mgr._account)]  # the account is what the pool's handler belongs to
    del mgr
    gc.collect()
    assert [ref() for ref in gone] == [None, None]
    with pytest.raises(OutOfMemoryError):  # no handler left: the library's own error
        backend.library_allocate(2 * TOTAL)


async def test_a_hard_cap_on_other_libraries_refuses_them_and_not_the_manager(shared: SimulatorBackend) -> None:
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    called: list[int] = []
    mgr.pool.add_reclaim_hook(lambda nbytes: called.append(nbytes) or 0)
    mgr.pool.share("cupy", "torch", limit=100 * KiB)
    async with mgr:
        theirs = shared.library_allocate(60 * KiB)
        with pytest.raises(OutOfMemoryError, match="cap on other libraries"):
            shared.library_allocate(60 * KiB)  # refused by the allocator, whatever is free
        assert called == []  # the cap is above the failure callback: nothing to reclaim for it
        with pytest.raises(OutOfMemoryError):
            with mgr.pool.torch_allocations(part):  # torch's tensors are under the cap too
                shared.library_allocate(60 * KiB)
        await mgr.request(part, _floats(100_000))  # aiocubie's own 400 KB: not under it
        shared.library_free(theirs)
        shared.library_free(shared.library_allocate(100 * KiB))  # room again once theirs is back
        mgr.pool.share(limit=100 * KiB)  # the same cap again: nothing changes
        with pytest.raises(ConfigurationError, match="set once"):
            mgr.pool.share(limit=200 * KiB)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "1GB"])
def test_the_cap_on_other_libraries_is_a_number_of_bytes(limit: object) -> None:
    mgr = MemoryManager(SimulatorBackend(TOTAL, allocator="rmm"))
    with pytest.raises(ConfigurationError, match="limit must be"):
        mgr.pool.share("cupy", limit=limit)  # type: ignore[arg-type]


async def test_a_hook_that_says_it_freed_what_it_did_not_free_does_not_retry_forever(shared: SimulatorBackend) -> None:
    # the library retries while the handler says True: trusting the hooks' word had it retry for
    # as long as a hook said it freed something (forever, in the event loop's thread)
    calls: list[int] = []

    def liar(nbytes: int) -> int:
        calls.append(nbytes)
        if len(calls) > 50:  # bounds the test without the fix
            return 0
        return 4096  # says it freed 4 KiB; frees nothing

    mgr = MemoryManager(shared)
    mgr.pool.add_reclaim_hook(liar)
    async with mgr:
        with pytest.raises(OutOfMemoryError):
            shared.library_allocate(2 * TOTAL)
        assert len(calls) == 1
        recovery = mgr.stats().recovery
        assert recovery.out_of_memory == 1 and recovery.failed == 1 and recovery.hook_bytes_freed == 4096


async def test_a_library_recovery_keeps_out_of_memory_equal_to_recovered_plus_failed(shared: SimulatorBackend) -> None:
    # README, Guarantees: out_of_memory always equals recovered + failed (a library's recovery
    # that let it retry counted neither)
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    mgr.pool.add_reclaim_hook(lambda nbytes: (mgr.free_all(), 400_000)[1])
    async with mgr:
        await mgr.request(part, _floats(100_000))
        block = shared.library_allocate(800 * KiB)  # fits once the manager's arrays are gone
        with pytest.raises(OutOfMemoryError):
            shared.library_allocate(800 * KiB)  # nothing left to free
        recovery = mgr.stats().recovery
        assert recovery.out_of_memory == 2
        assert (recovery.recovered, recovery.failed) == (1, 1)
        shared.library_free(block)


async def test_the_cap_on_other_libraries_outlives_a_new_rmm_resource(shared: SimulatorBackend) -> None:
    # on a GPU the limiting adaptor stays the device's current resource, and the next rmm resource
    # finds it installed: the cap holds and is still set once. The simulator's model forgot it.
    mgr = MemoryManager(shared)
    mgr.pool.share("cupy", limit=100 * KiB)
    with pytest.warns(UserWarning, match="resets the device context"):
        mgr.pool.set_allocator("rmm")
    async with mgr:
        with pytest.raises(OutOfMemoryError, match="cap on other libraries"):
            shared.library_allocate(200 * KiB)
        with pytest.raises(ConfigurationError, match="set once"):
            mgr.pool.share(limit=200 * KiB)


async def test_free_all_leaves_the_torch_bytes_an_instance_holds_counted_against_it(shared: SimulatorBackend) -> None:
    # free_all (a reclaim hook's usual call) frees aiocubie's arrays; torch's tensors stay torch's:
    # their count went, so they showed as another library's and the instance's budget lost them
    mgr, part = MemoryManager(shared), Part()
    mgr.register(part)
    async with mgr:
        await mgr.request(part, _floats(1000))
        with mgr.pool.torch_allocations(part):
            tensor = shared.library_allocate(5000)
        mgr.free_all()
        mgr.free("torch")
        stats = mgr.stats()
        assert stats.instances["Part#1"].live_bytes == 5000
        assert stats.other_bytes == 0 and stats.pool.in_use == stats.live_bytes + stats.other_bytes == 5000
        shared.library_free(tensor)
