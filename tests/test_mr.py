"""aiocubie.mr: resources a user composes, passed as ``allocator=`` (a name, a resource or a factory).

The registry of allocator names (one class and one registration add an allocator), the adaptors
(statistics, a limit, a failure callback) stacked over any resource, and the pool other libraries
share found through a user's adaptors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryKind, MemoryManager, create_backend, mr
from aiocubie._backends import Device, StreamLike, _allocators
from aiocubie.errors import AiocubieWarning, ConfigurationError, OutOfMemoryError, UnknownAllocatorError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

TOTAL = 1 << 20


class Part:
    """A registered component."""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The allocator registry as it is, restored after the test (registrations are process-wide)."""
    monkeypatch.setattr(_allocators, "_FACTORIES", {name: dict(by) for name, by in _allocators._FACTORIES.items()})
    yield


def _floats(n: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest(shape=(n,), dtype=np.float32)}


async def test_a_composed_resource_passed_as_allocator_serves_the_manager() -> None:
    sim = SimulatorBackend(TOTAL, allocator="cupy")
    stats = mr.StatisticsAdaptor(mr.LimitingAdaptor(sim.device.create_resource("cupy"), TOTAL // 2))
    mgr, part = MemoryManager(sim, allocator=stats), Part()
    mgr.register(part)
    async with mgr:
        response = await mgr.request(part, _floats(1000))
        assert response.arrays["x"].shape == (1000,)
        assert (stats.current_bytes, stats.current_count, stats.total_count) == (4000, 1, 1)
        assert mgr.pool.allocator == "cupy"  # a stack is named after its base resource
        mgr.free_all()
        assert (stats.current_bytes, stats.peak_bytes, stats.total_bytes) == (0, 4000, 4000)
    sim.close()


async def test_set_allocator_takes_a_resource() -> None:
    sim = SimulatorBackend(TOTAL)
    mgr, part = MemoryManager(sim), Part()
    mgr.register(part)
    stats = mr.StatisticsAdaptor(sim.device.create_resource("cupy_async"))
    with pytest.warns(AiocubieWarning, match="resets the device context"):
        mgr.pool.set_allocator(stats)
    assert mgr.pool.allocator == "cupy_async"
    async with mgr:
        await mgr.request(part, _floats(10))
        assert stats.current_count == 1
    sim.close()


async def test_a_factory_passed_as_allocator_is_called_with_the_new_device() -> None:
    made: list[mr.StatisticsAdaptor] = []

    def factory(device: Device) -> mr.MemoryResource:
        made.append(mr.StatisticsAdaptor(device.create_resource("driver")))
        return made[-1]

    mgr, part = MemoryManager("simulator", allocator=factory), Part()
    mgr.register(part)
    async with mgr:
        await mgr.request(part, _floats(100))
    assert len(made) == 1 and made[0].total_bytes == 400 and made[0].current_bytes == 0
    backend = create_backend("simulator", allocator=factory)
    assert backend.resource is made[-1]
    backend.close()


async def test_one_class_and_one_registration_add_an_allocator(registry: None) -> None:
    class Counting(mr.ResourceAdaptor):
        """Counts its allocations (the one class)."""

        calls = 0

        def allocate(self, nbytes: int, kind: MemoryKind, stream: StreamLike | None) -> mr.Block:
            Counting.calls += 1
            return self.upstream.allocate(nbytes, kind, stream)

    mr.register_allocator("counting", lambda device: Counting(device.create_resource("driver")), backend="simulator")
    assert "counting" in mr.allocator_names()
    mgr, part = MemoryManager("simulator", allocator="counting"), Part()
    assert mgr.pool.allocator == "counting"  # a registered stack is named as registered
    mgr.register(part)
    async with mgr:
        await mgr.request(part, _floats(10))
    assert Counting.calls == 1
    with pytest.raises(UnknownAllocatorError, match=r"registered for the simulator backend only, not 'cuda'"):
        _allocators.find_factory("counting", "cuda")


def test_an_unknown_name_lists_the_registered_ones(registry: None) -> None:
    mr.register_allocator("mine", lambda device: device.create_resource("driver"), backend="simulator")
    with pytest.raises(
        UnknownAllocatorError, match=r"unknown allocator 'slab': use one of 'default', 'driver'.*'mine'"
    ):
        MemoryManager("simulator", allocator="slab")
    with pytest.raises(UnknownAllocatorError, match="unknown allocator 'slab'"):
        SimulatorBackend(TOTAL).device.create_resource("slab")
    with pytest.raises(UnknownAllocatorError, match="a MemoryResource or a factory"):
        _allocators.make_resource(SimulatorBackend(TOTAL).device, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "backend", "match"),
    [("default", "simulator", "other than 'default'"), ("", "simulator", "non-empty"), ("x", "tpu", "'tpu'")],
)
def test_bad_registrations_are_refused(registry: None, name: str, backend: str, match: str) -> None:
    with pytest.raises(UnknownAllocatorError, match=match):
        mr.register_allocator(name, lambda device: device.create_resource("driver"), backend=backend)
    with pytest.raises(UnknownAllocatorError, match="callable"):
        mr.register_allocator("x", "driver", backend="simulator")  # type: ignore[arg-type]


def test_the_adaptors_compose() -> None:
    sim = SimulatorBackend(TOTAL)
    base = sim.device.create_resource("driver")
    limited = mr.LimitingAdaptor(base, 1000)
    held = [limited.allocate(600, MemoryKind.DEVICE, None)]

    def spill(nbytes: int) -> bool:  # the user's own step at the failing allocation: give a block back
        if not held:
            return False
        limited.deallocate(held.pop())
        return True

    stats = mr.StatisticsAdaptor(mr.FailureCallbackAdaptor(limited, spill))
    block = stats.allocate(600, MemoryKind.DEVICE, None)  # over the limit: spill frees the first, then it fits
    assert not held and limited.held == 600 and stats.current_bytes == 600
    with pytest.raises(OutOfMemoryError, match="limit of 1000"):
        stats.allocate(600, MemoryKind.DEVICE, None)  # nothing left to spill
    host = stats.allocate(5000, MemoryKind.HOST, None)  # host kinds are not under the device limit
    assert stats.current_count == 2 and stats.pool_facts() == base.pool_facts()
    stats.deallocate(block)
    stats.deallocate(host)
    assert (limited.held, stats.current_bytes, stats.peak_bytes, stats.peak_count) == (0, 0, 5600, 2)
    with pytest.raises(ConfigurationError, match="wraps a MemoryResource"):
        mr.StatisticsAdaptor("driver")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="limit must be"):
        mr.LimitingAdaptor(base, 0)
    with pytest.raises(ConfigurationError, match="callback must be callable"):
        mr.FailureCallbackAdaptor(base, None)  # type: ignore[arg-type]
    sim.close()


async def test_the_shared_pool_is_found_through_a_users_adaptors() -> None:
    sim = SimulatorBackend(TOTAL, allocator="rmm")
    stack = mr.StatisticsAdaptor(mr.LimitingAdaptor(sim.resource, TOTAL))
    assert not isinstance(sim.resource, mr.SharedPool)  # the simulator's faults adaptor is on top of it
    mgr, part = MemoryManager(sim, allocator=stack), Part()
    mgr.register(part)
    mgr.pool.share("cupy")  # found under the user's adaptors
    assert sim.device.shared is not None and sim.device.shared.handler is not None  # the manager's recovery
    async with mgr:
        await mgr.request(part, _floats(100))
        theirs = sim.library_allocate(1000)
        assert mgr.stats().other_bytes == 1000
        sim.library_free(theirs)
    sim.close()


def test_the_public_names_live_in_mr() -> None:
    import aiocubie

    assert not hasattr(aiocubie, "ALLOCATORS") and "PoolFacts" not in aiocubie.__all__
    assert mr.PoolFacts().cached is None
    assert set(mr.__all__) <= set(dir(mr))


def test_a_factory_that_cannot_take_the_device_is_refused_before_a_reset() -> None:
    sim = SimulatorBackend(TOTAL)
    mgr = MemoryManager(sim)
    with pytest.raises(UnknownAllocatorError, match="called with the device"):
        mgr.pool.set_allocator(cast(Any, lambda: None))
    with pytest.raises(UnknownAllocatorError, match="returned .*not a MemoryResource"):
        MemoryManager(sim, allocator=cast(Any, lambda device: None))
    assert sim.device.resets == 0
    sim.close()


def test_a_registered_factory_that_returns_no_resource_is_refused_by_name(registry: None) -> None:
    mr.register_allocator("junk", lambda device: 3, backend="simulator")
    with pytest.raises(UnknownAllocatorError, match=r"allocator 'junk'.* returned 3, not a MemoryResource"):
        MemoryManager("simulator", allocator="junk")
    mgr = MemoryManager("simulator")
    with pytest.raises(UnknownAllocatorError, match=r"allocator 'junk'.* returned 3, not a MemoryResource"):
        mgr.pool.set_allocator("junk")
    assert mgr.pool.allocator == "driver"  # nothing was reset


def test_a_factory_that_does_not_take_the_device_is_refused_when_registered(registry: None) -> None:
    with pytest.raises(UnknownAllocatorError, match="called with the device"):
        mr.register_allocator("nullary", lambda: None, backend="simulator")  # type: ignore[arg-type,misc]
    assert "nullary" not in mr.allocator_names()


async def test_a_resource_made_on_another_device_is_refused() -> None:
    # its blocks would come from the other device's memory while the budget reads this one's
    other, sim = SimulatorBackend(TOTAL), SimulatorBackend(TOTAL)
    foreign = mr.StatisticsAdaptor(other.device.create_resource("driver"))
    with pytest.raises(UnknownAllocatorError, match="made on another device"):
        MemoryManager(sim, allocator=foreign)
    with pytest.raises(UnknownAllocatorError, match="made on another device"):
        SimulatorBackend(TOTAL, allocator=foreign)
    with pytest.raises(UnknownAllocatorError, match="made on another device"):
        MemoryManager(sim, allocator=lambda device: foreign)
    mgr, part = MemoryManager(sim), Part()
    with pytest.raises(UnknownAllocatorError, match="made on another device"):
        mgr.pool.set_allocator(foreign)
    with pytest.warns(AiocubieWarning, match="resets the device context"):
        mgr.pool.set_allocator(mr.StatisticsAdaptor(sim.device.create_resource("driver")))  # this device's: taken
    mgr.register(part)
    async with mgr:
        await mgr.request(part, _floats(10))
    assert other.used == 0


def test_a_registered_factory_that_hands_out_another_devices_resource_is_refused(registry: None) -> None:
    foreign = SimulatorBackend(TOTAL).device.create_resource("driver")
    mr.register_allocator("elsewhere", lambda device: mr.StatisticsAdaptor(foreign), backend="simulator")
    with pytest.raises(UnknownAllocatorError, match="made on another device"):
        MemoryManager("simulator", allocator="elsewhere")


@pytest.mark.parametrize("mode", ["passive", "active"])
async def test_a_limiting_adaptor_below_the_device_is_planned_for(mode: str) -> None:
    # a user's cap inside the stack: batches are planned (chunked) to fit what it leaves, instead of
    # being planned against the device and failing with OutOfMemoryError at the allocation
    with SimulatorBackend(1 << 20, granule=0) as sim:
        capped = mr.LimitingAdaptor(sim.device.create_resource("driver"), 256 << 10)
        async with MemoryManager(sim, allocator=capped, mode=mode, headroom=0.0) as mgr:
            assert mgr.pool.memory_info().total == 256 << 10 and mgr.pool.memory_info().free == 256 << 10
            owner = object()
            mgr.register(owner)
            held = await mgr.request(owner, {"kept": ArrayRequest((64 << 10,), "u1", unchunkable=True)})
            assert mgr.pool.memory_info().free == 192 << 10 and capped.held == 64 << 10
            async with mgr.request(owner, {"x": ArrayRequest((512 << 10,), "u1")}) as response:
                assert response.chunks > 1 and response.chunk_length <= 192 << 10  # a byte a run
                assert capped.held <= capped.limit
            mgr.release(held)
            assert capped.held == 0 and mgr.pool.memory_info().free == 256 << 10
