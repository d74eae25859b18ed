"""Tests of the MemoryManager facade on the simulator: registration, budgets, stream groups,
release, context resets, the direct allocation path, copies, managed memory and statistics.

Async tests run on asyncio and trio (a few on uvloop too). Streams are held shut with gates rather than timed;
``fail_after`` only guards against hangs.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
from simkit import (
    HANG_GUARD,
    LOOPS,
    TOTAL,
    Part,
    assert_all_released,
    hold_stream,
    interrupt_in_flight,
    vec,
    wait_until,
)

import aiocubie as ac
from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie._backends._sim import host_data
from aiocubie.errors import (
    AiocubieWarning,
    AllocationError,
    BackendError,
    BudgetError,
    ConfigurationError,
    ContextResetError,
    InsufficientMemoryError,
    InvalidRequestError,
    ManagerStateError,
    RegistrationError,
    ReleasedError,
    UnknownAllocatorError,
)
from aiocubie.simulator import SimulatorBackend

MiB = 1 << 20


# -- construction and lifecycle -----------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"headroom": 1.0},
        {"headroom": -0.1},
        {"batch_window": -1.0},
        {"batch_window": float("inf")},
        {"free_cache_seconds": float("nan")},
        {"max_batch": 0},
        {"mode": "aggressive"},
        {"policy": "retry"},
    ],
)
def test_bad_options_raise(sim: SimulatorBackend, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        MemoryManager(sim, **kwargs)


def test_unknown_backend_name_raises() -> None:
    with pytest.raises(ConfigurationError, match="unknown backend"):
        MemoryManager("tpu")


@pytest.mark.anyio
async def test_running_and_reentry(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    assert not mgr.running
    async with mgr:
        assert mgr.running
        with pytest.raises(ManagerStateError, match="already running"):
            async with mgr:
                pass
        with pytest.raises(ManagerStateError, match="leave its `async with` first"):
            mgr.close()
    assert not mgr.running
    async with mgr:  # a manager can be started again
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"a": vec(10)})
        assert response.arrays["a"].shape == (10,)
    assert_all_released(mgr, sim)  # leaving `async with` frees what was still held


@pytest.mark.anyio
async def test_request_outside_async_with_raises_when_awaited(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    part = Part()
    mgr.register(part)
    pending = mgr.request(part, {"a": vec(10)})  # checked, not queued: no error yet
    with pytest.raises(ManagerStateError, match="not running"):
        await pending
    assert sim.used == 0


@pytest.mark.anyio
async def test_awaiting_a_request_twice_raises(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        pending = mgr.request(part, {"a": vec(10)})
        response = await pending
        with pytest.raises(ManagerStateError, match="awaited only once"):
            await pending
        mgr.release(response)
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_aclose_fails_pending_requests(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim, batch_window=10)
    a, b = Part(), Part()
    mgr.register(a, stream_group="g")
    mgr.register(b, stream_group="g")  # b never asks: a's batch stays open for the window
    errors: list[BaseException] = []

    async def ask() -> None:
        try:
            await mgr.request(a, {"x": vec(10)})
        except ManagerStateError as exc:
            errors.append(exc)

    with anyio.fail_after(HANG_GUARD):
        async with anyio.create_task_group() as tg:
            async with mgr:
                tg.start_soon(ask)
                await wait_until(lambda: mgr.stats().groups["g"].requests == 1)
    assert len(errors) == 1 and "closed" in str(errors[0])
    assert_all_released(mgr, sim)


# -- registration ---------------------------------------------------------------------------
def test_duplicate_registration_raises(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    part = Part()
    mgr.register(part, name="solver")
    with pytest.raises(RegistrationError, match="solver is already registered"):
        mgr.register(part)
    assert mgr.is_registered(part)


@pytest.mark.parametrize("proportion", [0, 0.0, -0.1, 1.5, float("nan"), "half", True])
def test_bad_proportion_raises_and_registers_nothing(sim: SimulatorBackend, proportion: Any) -> None:
    mgr = MemoryManager(sim)
    part = Part()
    with pytest.raises(BudgetError):
        mgr.register(part, proportion=proportion)
    assert not mgr.is_registered(part)
    mgr.register(part, proportion=0.5)  # nothing was half-registered
    assert mgr.budget.proportion(part) == 0.5


@pytest.mark.parametrize("group", ["", 3, None])
def test_bad_group_name_raises(sim: SimulatorBackend, group: Any) -> None:
    mgr = MemoryManager(sim)
    part = Part()
    with pytest.raises(RegistrationError, match="non-empty strings"):
        mgr.register(part, stream_group=group)
    assert not mgr.is_registered(part)


@pytest.mark.parametrize("hook", ["invalidate_hook", "ready_hook"])
def test_non_callable_hook_raises(sim: SimulatorBackend, hook: str) -> None:
    mgr = MemoryManager(sim)
    part = Part()
    with pytest.raises(RegistrationError, match=f"{hook} must be callable"):
        mgr.register(part, **{hook: "not a function"})  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match="name must be a string"):
        mgr.register(part, name=5)  # type: ignore[arg-type]
    assert not mgr.is_registered(part)


@pytest.mark.anyio
async def test_names_that_utf8_cannot_write_are_refused() -> None:
    async with ac.MemoryManager("simulator") as mgr:
        with pytest.raises(RegistrationError, match="cannot be written as UTF-8"):
            mgr.register(Part(), name="a\udcff")
        with pytest.raises(RegistrationError, match="cannot be written as UTF-8"):
            mgr.register(Part(), stream_group="g\ud800")


@pytest.mark.anyio
@pytest.mark.parametrize("value", [None, 5, "solver", b"x", (1, 2), 1.5, True])
async def test_register_refuses_values_that_are_not_components(value: object) -> None:
    async with ac.MemoryManager("simulator") as mgr:
        with pytest.raises(RegistrationError, match="register the component object itself"):
            mgr.register(value)
        assert not mgr.statistics().members


def test_proportions_caps_and_the_auto_pool(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    manual, auto1, auto2 = Part(), Part(), Part()
    mgr.register(manual, proportion=0.3)
    mgr.register(auto1)
    assert mgr.budget.proportion(auto1) == pytest.approx(0.7)
    mgr.register(auto2)
    assert mgr.budget.proportion(auto1) == pytest.approx(0.35) == mgr.budget.proportion(auto2)
    assert mgr.budget.cap(manual) == 300_000
    assert mgr.budget.cap(auto2) == 350_000
    assert mgr.budget.manual_pool == pytest.approx(0.3)
    assert mgr.budget.auto_pool == pytest.approx(0.7)
    mgr.unregister(auto1)  # the auto pool rebalances
    assert mgr.budget.cap(auto2) == 700_000
    late = Part()
    with pytest.raises(BudgetError, match="auto member"):
        mgr.register(late, proportion=0.68)  # would leave under 5% for auto2


def test_manual_pool_may_take_everything_without_auto_members(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    big, other = Part(), Part()  # held: a collected instance would be unregistered
    with pytest.warns(AiocubieWarning, match="minimum"):
        mgr.register(big, proportion=0.97)
    with pytest.raises(BudgetError, match="over 1"):
        mgr.register(other, proportion=0.05)
    with pytest.raises(BudgetError, match="auto member"):
        mgr.register(other)
    assert not mgr.is_registered(other)


@pytest.mark.anyio
async def test_an_auto_pool_left_short_with_no_member_says_what_it_means() -> None:
    async with ac.MemoryManager("simulator") as mgr:
        first, second = Part(), Part()  # held: a collected component leaves its share
        mgr.register(first, proportion=0.5)
        with pytest.warns(ac.errors.AiocubieWarning, match="allowed while no member is in the auto pool"):
            mgr.register(second, proportion=0.5)


def test_switching_limit_modes(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    a, b = Part(), Part()
    mgr.register(a)
    mgr.register(b)
    mgr.budget.move_to_manual(a, 0.2)
    assert mgr.budget.proportion(a) == pytest.approx(0.2)
    assert mgr.budget.proportion(b) == pytest.approx(0.8)
    with pytest.raises(BudgetError, match="already in the manual pool"):
        mgr.budget.move_to_manual(a, 0.3)
    mgr.budget.set_manual(a, 0.4)
    assert mgr.budget.cap(a) == 400_000 and mgr.budget.cap(b) == 600_000
    with pytest.raises(BudgetError):
        mgr.budget.set_manual(a, 0.99)  # b would be left under 5%
    assert mgr.budget.proportion(a) == pytest.approx(0.4)
    mgr.budget.set_auto(a)
    assert mgr.budget.proportion(a) == pytest.approx(0.5) == mgr.budget.proportion(b)
    with pytest.raises(BudgetError, match="already in the auto pool"):
        mgr.budget.set_auto(a)
    mgr.budget.set_manual(b, 0.1)  # set_manual_proportion also moves out of the auto pool
    assert mgr.budget.proportion(a) == pytest.approx(0.9)
    with pytest.raises(ConfigurationError):
        mgr.budget.set_mode("aggressive")
    mgr.budget.set_mode("active")
    assert mgr.options.active and mgr.budget.mode.value == "active"


def test_unregistered_instance_errors(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    stranger = Part()
    calls: list[Callable[[], Any]] = [
        lambda: mgr.request(stranger, {"a": vec(1)}),
        lambda: mgr.allocate(stranger, {"a": vec(1)}),
        lambda: mgr.groups.stream(stranger),
        lambda: mgr.groups.group_of(stranger),
        lambda: mgr.budget.cap(stranger),
        lambda: mgr.budget.proportion(stranger),
        lambda: mgr.unregister(stranger),
        lambda: mgr.budget.set_manual(stranger, 0.5),
        lambda: mgr.groups.move(stranger, "x"),
    ]
    for call in calls:
        with pytest.raises(RegistrationError, match="not registered: call mgr.register"):
            call()


def test_unregister_frees_arrays_and_budget(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    a, b = Part(), Part()
    mgr.register(a)
    mgr.register(b)
    mgr.allocate(a, {"x": vec(1000)})
    kept = mgr.allocate(b, {"y": vec(500)})
    assert sim.used == 12_000
    mgr.unregister(a)
    assert sim.used == 4_000 and mgr.stats().live_bytes == 4_000
    assert not mgr.is_registered(a)
    assert mgr.budget.proportion(b) == pytest.approx(1.0)
    mgr.release(kept)
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_unregister_fails_a_queued_request(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, batch_window=10) as mgr:
        a, b = Part(), Part()
        mgr.register(a, stream_group="g")
        mgr.register(b, stream_group="g")  # b never asks: a's request stays queued
        errors: list[BaseException] = []

        async def ask() -> None:
            try:
                await mgr.request(a, {"x": vec(10)})
            except RegistrationError as exc:
                errors.append(exc)

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await wait_until(lambda: mgr.stats().groups["g"].requests == 1)
                mgr.unregister(a)
        assert len(errors) == 1 and "unregistered before its request was served" in str(errors[0])
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_collected_instance_is_unregistered_and_its_arrays_freed(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        keeper = Part()
        mgr.register(keeper, name="keeper")
        doomed = Part()
        mgr.register(doomed, name="doomed", stream_group="gone")
        response = await mgr.request(doomed, {"a": vec(100)})
        mgr.allocate(doomed, {"b": vec(50)})
        assert sim.used == 1200
        del doomed, response  # the caller forgets its arrays too
        gc.collect()
        assert "gone" not in mgr.groups.members()  # reaped by this very call; the emptied group is forgotten
        assert sim.used == 0 and mgr.stats().live_bytes == 0
        assert mgr.budget.proportion(keeper) == pytest.approx(1.0)


# -- stream groups --------------------------------------------------------------------------
def test_stream_groups(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    a, b, c = Part(), Part(), Part()
    mgr.register(a, stream_group="solve", name="a")
    mgr.register(b, stream_group="solve", name="b")
    mgr.register(c, name="c")
    assert mgr.groups.stream(a) is mgr.groups.stream(b)
    assert mgr.groups.stream(a) is not mgr.groups.stream(c)
    assert mgr.groups.group_of(a) == "solve" and mgr.groups.group_of(c) == "default"
    assert mgr.groups.is_grouped(a) and not mgr.groups.is_grouped(c)
    assert mgr.groups.members() == {"solve": ["a", "b"], "default": ["c"]}

    mgr.groups.move(b, "load")
    assert mgr.groups.group_of(b) == "load"
    assert mgr.groups.stream(b) is not mgr.groups.stream(a)
    assert not mgr.groups.is_grouped(a)
    mgr.groups.move(b, "default")
    assert mgr.groups.stream(b) is mgr.groups.stream(c) and mgr.groups.is_grouped(c)
    with pytest.raises(RegistrationError, match="non-empty strings"):
        mgr.groups.move(b, "")
    with pytest.raises(RegistrationError, match="no stream group 'nope'"):
        mgr.budget.available("nope")


def test_reinit_streams_gives_new_streams(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    a, b = Part(), Part()
    mgr.register(a, stream_group="one")
    mgr.register(b, stream_group="two")
    before = {mgr.groups.stream(a), mgr.groups.stream(b)}
    mgr.groups.reinit_streams()
    after = {mgr.groups.stream(a), mgr.groups.stream(b)}
    assert len(after) == 2 and not before & after
    event = sim.device.record_event(mgr.groups.stream(a))
    event.synchronize()  # the new streams work


# -- release --------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_async_with_frees_on_exit_and_on_error(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        async with mgr.request(part, {"a": vec(100), "b": vec(100, "int32")}) as response:
            assert sim.used == 1200 and mgr.stats().live_bytes == 1200
            assert set(response.arrays) == {"a", "b"}
        assert_all_released(mgr, sim)

        with pytest.raises(ZeroDivisionError):
            async with mgr.request(part, {"a": vec(100)}):
                assert sim.used == 800
                1 / 0  # noqa: B018
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_release_is_idempotent(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        first = await mgr.request(part, {"a": vec(100)})
        second = await mgr.request(part, {"a": vec(10)})
        mgr.release(first)
        mgr.release(first)
        assert sim.used == 80 and mgr.stats().live_bytes == 80
        mgr.release(second)
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_free_by_label_across_instances_and_free_all(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        a, b = Part(), Part()
        mgr.register(a, stream_group="ga")
        mgr.register(b, stream_group="gb")
        await mgr.request(a, {"state": vec(100), "params": vec(10, unchunkable=True)})
        await mgr.request(b, {"state": vec(200)})
        mgr.allocate(b, {"params": vec(5, unchunkable=True)})
        assert sim.used == (100 + 10 + 200 + 5) * 8
        mgr.free("state")
        assert sim.used == (10 + 5) * 8 == mgr.stats().live_bytes
        mgr.free("nothing by that name")
        assert sim.used == 120
        mgr.free_all()
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_invalidate_all_calls_hooks_once_releases_and_fails_in_flight(sim: SimulatorBackend) -> None:
    calls: list[str] = []
    async with MemoryManager(sim) as mgr:
        a, b, c = Part(), Part(), Part()
        mgr.register(a, stream_group="busy", invalidate_hook=lambda: calls.append("a"))
        mgr.register(b, invalidate_hook=lambda: calls.append("b"))
        mgr.register(c)  # no hook
        await mgr.request(b, {"x": vec(100)})
        errors = await interrupt_in_flight(mgr, sim, a, {"y": vec(100)}, mgr.pool.invalidate_all, ContextResetError)
        assert sorted(calls) == ["a", "b"]
        assert len(errors) == 1 and "invalidate_all" in str(errors[0])
        assert_all_released(mgr, sim)
        response = await mgr.request(a, {"y": vec(10)})  # the group serves new requests
        assert response.arrays["y"].shape == (10,)
    assert sorted(calls) == ["a", "b"]


@pytest.mark.anyio
async def test_set_allocator_resets_like_invalidate_all(sim: SimulatorBackend) -> None:
    calls: list[str] = []
    async with MemoryManager(sim) as mgr:
        a, b = Part(), Part()
        mgr.register(a, stream_group="busy", invalidate_hook=lambda: calls.append("a"))
        mgr.register(b, invalidate_hook=lambda: calls.append("b"))
        await mgr.request(b, {"x": vec(100)})
        old_streams = {mgr.groups.stream(a), mgr.groups.stream(b)}
        with pytest.warns(AiocubieWarning, match="resets the device context"):
            errors = await interrupt_in_flight(
                mgr, sim, a, {"y": vec(100)}, lambda: mgr.pool.set_allocator("cupy"), ContextResetError
            )
        assert mgr.pool.allocator == "cupy" and sim.resets == 1
        assert sorted(calls) == ["a", "b"]
        assert len(errors) == 1 and "set_allocator('cupy')" in str(errors[0])
        assert_all_released(mgr, sim)
        assert not old_streams & {mgr.groups.stream(a), mgr.groups.stream(b)}
        async with mgr.request(a, {"y": vec(10)}) as response:  # served on the new context
            assert response.stream is mgr.groups.stream(a)
        assert_all_released(mgr, sim)


def test_an_allocator_for_a_given_backend_is_made_beside_its_resource(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim, allocator="cupy")  # no reset: nothing was allocated through this manager
    assert mgr.pool.allocator == "cupy" and sim.resource.name == "driver" and sim.resets == 0
    assert MemoryManager(sim, allocator="default").pool.allocator == "driver" == MemoryManager(sim).pool.allocator
    with pytest.raises(UnknownAllocatorError, match="unknown allocator 'tcmalloc'"):
        MemoryManager(sim, allocator="tcmalloc")


@pytest.mark.anyio
async def test_unknown_allocator_resets_nothing(sim: SimulatorBackend) -> None:
    calls: list[str] = []
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, invalidate_hook=lambda: calls.append("hook"))
        response = await mgr.request(part, {"x": vec(100)})
        stream = mgr.groups.stream(part)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing is reset, so nothing may warn of a reset
            with pytest.raises(UnknownAllocatorError, match="unknown allocator 'tcmalloc'"):
                mgr.pool.set_allocator("tcmalloc")
        assert calls == [] and sim.resets == 0 and mgr.pool.allocator == "driver"
        assert sim.used == 800 and mgr.stats().live_bytes == 800
        assert mgr.groups.stream(part) is stream
        mgr.release(response)
    assert_all_released(mgr, sim)


def test_a_raising_invalidate_hook_does_not_stop_the_others(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    calls: list[str] = []

    def broken() -> None:
        calls.append("broken")
        raise RuntimeError("hook bug")

    parts = Part(), Part()
    mgr.register(parts[0], invalidate_hook=broken)
    mgr.register(parts[1], invalidate_hook=lambda: calls.append("fine"))
    mgr.pool.invalidate_all()
    assert sorted(calls) == ["broken", "fine"]


# -- the direct path ------------------------------------------------------------------------
@pytest.mark.anyio
async def test_allocate_all_and_allocate(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)  # the direct path works without `async with`
    part = Part()
    mgr.register(part, name="direct")
    gate = hold_stream(mgr.groups.stream(part))
    response = mgr.allocate(part, {"a": ArrayRequest((4, 25), "float32", zero=True), "b": vec(10, unchunkable=True)})
    host_data(response.arrays["a"])[...] = 3  # garbage in fresh device memory (behind the held stream)
    gate.set()
    with anyio.fail_after(HANG_GUARD):
        await mgr.groups.sync(part)
    assert not response.arrays["a"].any(), "the zero fill is queued on the group's stream"
    assert response.chunks == 1 and response.chunked_shapes == {"a": (4, 25), "b": (10,)}
    assert response.stream is mgr.groups.stream(part)
    array = mgr.allocate(part, {"c": vec(5, "int64")}).arrays["c"]
    assert array.shape == (5,) and array.dtype == np.int64
    assert sim.used == 400 + 80 + 40 == mgr.stats().live_bytes
    assert mgr.stats().instances["direct"].live_bytes == 520
    mgr.release(response)
    mgr.free("c")
    assert_all_released(mgr, sim)


def test_allocate_all_too_large_or_failing_allocates_nothing(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    part = Part()
    mgr.register(part)
    with pytest.raises(InsufficientMemoryError, match="use await mgr.request"):
        mgr.allocate(part, {"a": vec(TOTAL // 8)})
    sim.faults.inject("allocate", after=1)
    with pytest.raises(AllocationError, match="injected fault"):
        mgr.allocate(part, {"a": vec(100), "b": vec(100), "c": vec(100)})
    assert_all_released(mgr, sim)
    sim.faults.inject("record_event")
    with pytest.raises(BackendError, match="injected fault"):
        mgr.allocate(part, {"a": vec(100)})
    assert_all_released(mgr, sim)


# -- copies, host arrays, managed memory ----------------------------------------------------
@pytest.mark.anyio
async def test_to_device_from_device_round_trip() -> None:
    sim = SimulatorBackend(total=TOTAL, latency=0.002)  # copies really run later, on the stream
    try:
        async with MemoryManager(sim) as mgr:
            part = Part()
            mgr.register(part)
            rng = np.random.default_rng(7)
            hosts: list[np.ndarray[Any, Any]] = [
                rng.standard_normal((30, 40)),
                rng.integers(-1000, 1000, 500).astype(np.int32),
            ]
            async with mgr.request(
                part, {"a": ArrayRequest((30, 40), "float64"), "b": ArrayRequest(500, "int32", unchunkable=True)}
            ) as response:
                devices = [response.arrays["a"], response.arrays["b"]]
                await mgr.host.to_device(part, hosts, devices)
                backs = [mgr.host.array(h.shape, h.dtype) for h in hosts]
                await mgr.host.from_device(part, devices, backs)
                for host, back in zip(hosts, backs):
                    np.testing.assert_array_equal(back, host)
                with pytest.raises(InvalidRequestError, match="pair them up"):
                    await mgr.host.to_device(part, hosts, devices[:1])
                with pytest.raises(BackendError, match="shapes and dtypes must match"):
                    await mgr.host.to_device(part, [hosts[1]], [devices[0]])
                sim.faults.inject("copy")
                with pytest.raises(BackendError, match="injected fault"):
                    await mgr.host.from_device(part, devices, backs)
        assert_all_released(mgr, sim)
    finally:
        sim.close()


@pytest.mark.anyio
async def test_sync_stream_waits_for_queued_work(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        gate = hold_stream(mgr.groups.stream(part))
        synced = anyio.Event()

        async def sync() -> None:
            await mgr.groups.sync(part)
            synced.set()

        try:
            with anyio.fail_after(HANG_GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sync)
                    for _ in range(20):
                        await anyio.lowlevel.checkpoint()
                    assert not synced.is_set()
                    gate.set()
        finally:
            gate.set()
        assert synced.is_set()


def test_create_host_array(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    for kind in ("pinned", "host"):
        zeros = mgr.host.array((3, 4), "float32", kind)
        assert zeros.shape == (3, 4) and zeros.dtype == np.float32 and not zeros.any()
        assert zeros.flags.c_contiguous
        like = np.arange(12.0).reshape(3, 4)
        copy = mgr.host.array((3, 4), "float64", kind, like=like)
        np.testing.assert_array_equal(copy, like)
        like[0, 0] = 99.0
        assert copy[0, 0] == 0.0, "like= copies; it does not alias"
    assert mgr.host.array(5, "int8").shape == (5,)
    with pytest.raises(InvalidRequestError, match="'pinned' or 'host'"):
        mgr.host.array(5, "float32", "device")
    with pytest.raises(InvalidRequestError, match="like has shape"):
        mgr.host.array((2, 2), "float32", like=np.zeros(4))
    assert sim.used == 0


@pytest.mark.anyio
async def test_managed_memory_prefetch_and_advice(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        async with mgr.request(part, {"m": vec(1000, kind="managed")}) as response:
            assert sim.used == 8000, "managed memory counts against the device"
            array = response.arrays["m"]
            await mgr.host.prefetch(part, array, 0)
            await mgr.host.prefetch(part, array, None)
            mgr.host.advise(array, "preferred_location", 0)
            mgr.host.advise(array, "accessed_by", None)
            mgr.host.advise(array, "read_mostly")
            with pytest.raises(BackendError, match="unknown managed-memory advice"):
                mgr.host.advise(array, "nonsense")  # type: ignore[arg-type]
            sim.faults.inject("prefetch")
            with pytest.raises(BackendError, match="injected fault"):
                await mgr.host.prefetch(part, array)
    assert_all_released(mgr, sim)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", LOOPS)
@pytest.mark.parametrize("thing", [5, "m", None, [1.0, 2.0], np.zeros(4, np.float32)], ids=repr)
async def test_prefetch_and_advise_refuse_a_non_array_even_with_a_fault_injected(thing: object) -> None:
    """Issue 22, item 11: prefetch of a non-array was accepted; with an injected prefetch fault the
    simulator raised a raw AttributeError instead of the injected BackendError."""
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim) as mgr:
        comp = object()
        mgr.register(comp)
        sim.faults.inject("prefetch")
        with pytest.raises(InvalidRequestError, match="prefetch needs a managed array"):
            await mgr.host.prefetch(comp, thing)
        with pytest.raises(InvalidRequestError, match="advise needs a managed array"):
            mgr.host.advise(thing, "read_mostly")
        async with mgr.request(comp, {"m": ArrayRequest((8,), np.float32, "managed")}) as response:
            with pytest.raises(BackendError, match="injected fault: prefetching 32 bytes"):
                await mgr.host.prefetch(comp, response.arrays["m"])  # the fault is still armed
            await mgr.host.prefetch(comp, response.arrays["m"])
    sim.close()


# -- observability --------------------------------------------------------------------------
@pytest.mark.anyio
async def test_stats_counts(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, batch_window=10) as mgr:
        a, b, c = Part(), Part(), Part()
        mgr.register(a, stream_group="pair", name="a")
        mgr.register(b, stream_group="pair", name="b")
        mgr.register(c, stream_group="solo", name="c")
        responses: list[ArrayResponse] = []

        async def ask(part: Part, n: int) -> None:
            responses.append(await mgr.request(part, {"x": vec(n)}))

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:  # one batch: both members ask
                tg.start_soon(ask, a, 1000)
                tg.start_soon(ask, b, 1000)
                tg.start_soon(ask, c, 500)
            first_a = next(r for r in responses if r.arrays["x"].shape == (1000,))
            mgr.release(first_a)
            # too big to fit whole: a batch of its own walked in several chunks
            responses.append(await mgr.request(c, {"x": vec(TOTAL // 8 - 500)}))

        stats = mgr.stats()
        assert stats.total == TOTAL and stats.free == sim.device.memory_info().free
        pair, solo = stats.groups["pair"], stats.groups["solo"]
        assert (pair.requests, pair.batches, pair.chunks) == (2, 1, 1)
        assert pair.live_bytes == 8000 and pair.peak_bytes == 16000
        big = responses[-1]
        assert big.chunks > 1
        assert (solo.requests, solo.batches, solo.chunks) == (2, 2, 1 + big.chunks)
        assert solo.live_bytes == 4000 + big.chunk_length * 8
        assert stats.live_bytes == pair.live_bytes + solo.live_bytes == sim.used
        assert stats.peak_bytes >= stats.live_bytes
        ia, ib, ic = stats.instances["a"], stats.instances["b"], stats.instances["c"]
        assert (ia.requests, ia.batches, ib.requests, ib.batches) == (1, 1, 1, 1)
        assert {ia.live_bytes, ib.live_bytes} == {0, 8000}
        assert ia.peak_bytes == ib.peak_bytes == 8000
        assert ic.requests == 2 and ic.failures == 0 and ic.cancellations == 0
        assert pair.queue_wait.count == 2 and pair.ready_latency.count == 2
        assert solo.ready_latency.count == 2 and ia.ready_latency.count == 1
        assert ia.ready_latency.p50 is not None and ia.ready_latency.p50 >= 0
        for response in responses:
            mgr.release(response)
        assert_all_released(mgr, sim)
        assert mgr.stats().peak_bytes == stats.peak_bytes


# -- scale ----------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_thousand_concurrent_requests(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        groups = [f"g{i}" for i in range(4)]
        parts = [Part() for _ in range(20)]
        for i, part in enumerate(parts):
            mgr.register(part, stream_group=groups[i % len(groups)])
        served = 0

        async def one(i: int) -> None:
            nonlocal served
            part = parts[i % len(parts)]
            runs = 10 + i % len(groups)  # one run length per group: a batch must agree on it
            async with mgr.request(part, {"x": vec(runs), "y": vec(3, "int8", unchunkable=True)}) as r:
                assert r.arrays["x"].shape == (runs,) and r.chunks == 1
                assert r.stream is mgr.groups.stream(part)
                await anyio.lowlevel.checkpoint()
            served += 1

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(1000):
                    tg.start_soon(one, i)
        assert served == 1000
        stats = mgr.stats()
        assert sum(g.requests for g in stats.groups.values()) == 1000
        assert sum(g.failures + g.cancellations for g in stats.groups.values()) == 0
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_stats_keep_the_peak_of_an_instance_that_left(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        gone, stays = Part(), Part()
        mgr.register(gone, name="gone")
        mgr.register(stays, name="stays")
        async with mgr.request(gone, {"x": vec(1000)}):
            pass
        mgr.unregister(gone)
        del gone
        await mgr.request(stays, {"x": vec(10)})
        snap = mgr.stats()
        assert snap.instances["gone"].peak_bytes == 8000 and snap.instances["gone"].live_bytes == 0
        assert snap.instances["gone"].requests == 1
        assert snap.instances["stays"].peak_bytes == 80 and snap.instances["stays"].live_bytes == 80


@pytest.mark.anyio
async def test_free_all_fails_requests_in_flight_instead_of_resolving_them(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        requests = {"a": vec(500), "b": vec(500)}
        errors = await interrupt_in_flight(mgr, sim, part, requests, lambda: mgr.free("a"), ReleasedError)
        assert len(errors) == 1 and "free('a')" in str(errors[0])
        assert_all_released(mgr, sim)  # the other array went with it


def test_names_are_unique(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    first, other = Part(), Part()
    mgr.register(first, name="solver")
    with pytest.raises(RegistrationError, match="'solver' is taken"):
        mgr.register(other, name="solver")
    assert not mgr.is_registered(other)


@pytest.mark.anyio
async def test_queued_requests_follow_their_instance_to_a_new_group(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", batch_window=HANG_GUARD * 2) as mgr:
        mover, silent = Part(), Part()
        mgr.register(mover, proportion=0.5, stream_group="old")
        mgr.register(silent, proportion=0.1, stream_group="old")  # never asks: the batch stays open
        result: list[ArrayResponse] = []

        async def ask() -> None:
            result.append(await mgr.request(mover, {"x": vec(40_000)}))  # 320 kB: over "old"'s 100 kB

        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await wait_until(lambda: mgr.stats().groups["old"].requests == 1)
                mgr.groups.move(mover, "new")  # alone in "new": its batch closes at once
        assert result[0].chunks == 1 and result[0].stream is mgr.groups.stream(mover)
        mgr.free_all()
    assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_free_a_label_of_one_instance_or_of_all() -> None:
    sim = SimulatorBackend(1 << 20)
    async with MemoryManager(sim, batch_window=0) as mgr:
        a, b = Part(), Part()
        mgr.register(a)
        mgr.register(b)
        request = {"x": ArrayRequest((100,), "float64"), "y": ArrayRequest((10,), "float64", unchunkable=True)}
        await mgr.request(a, request)
        await mgr.request(b, request)
        assert sim.used == 2 * 880
        mgr.free("x", instance=a)
        assert sim.used == 880 + 80  # b's x and y, a's y
        mgr.free("x")
        assert sim.used == 2 * 80
        with pytest.raises(RegistrationError):
            mgr.free("y", instance=Part())
        mgr.free_all()
        assert sim.used == 0
