"""Tests of the simulator backend as a device: memory accounting, stream order, events, faults.

Synchronous (but for one check of ``launch``'s arguments, run on each event loop): the simulator is
called from one thread and completes events on its stream threads. Streams are held shut with a gate
(a threading.Event) instead of timing them. Bad settings of the simulator and its engines, and bad
arguments to ``launch``, are the library's errors, raised at the call.
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from simkit import LOOPS, ByHand

from aiocubie import MemoryKind
from aiocubie._backends._sim import host_data
from aiocubie.errors import (
    AllocationError,
    BackendError,
    ConfigurationError,
    InvalidRequestError,
    ReleasedError,
    UnknownAllocatorError,
)
from aiocubie.simulator import Engines, SimulatorBackend

F8 = np.dtype("float64")
TOTAL = 1 << 20
MiB = 1 << 20


@pytest.fixture
def sim() -> Iterator[SimulatorBackend]:
    backend = SimulatorBackend(total=TOTAL)
    yield backend
    backend.close()


@pytest.fixture
def mem(sim: SimulatorBackend) -> ByHand:
    """Allocations through ``sim``'s resource and array maker, as the device account makes them."""
    return ByHand(sim)


def gate_stream(stream: Any) -> threading.Event:
    """Hold ``stream`` shut until the returned gate is set."""
    gate = threading.Event()
    stream.enqueue(lambda: gate.wait(10))
    return gate


# -- memory ----------------------------------------------------------------------------------
def test_memory_accounting_by_kind(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    device = mem.allocate((100,), F8, MemoryKind.DEVICE, stream)
    managed = mem.allocate((10, 10), F8, MemoryKind.MANAGED, stream)
    assert sim.used == 1600
    for kind in (MemoryKind.PINNED, MemoryKind.MAPPED, MemoryKind.HOST):
        mem.allocate((1000,), F8, kind, stream)
    assert sim.used == 1600, "host kinds must not take VRAM"
    assert sim.device.memory_info().free == TOTAL - 1600
    assert sim.device.memory_info().total == TOTAL
    assert device.shape == (100,) and managed.shape == (10, 10) and device.dtype == F8
    mem.free(device)
    with pytest.raises(BackendError, match="given back twice"):  # on a GPU: memory another array may use
        mem.free(device)
    assert sim.used == 800
    mem.free(managed)
    assert sim.used == 0
    assert sim.device.memory_info().free == TOTAL


def test_occupy_takes_and_gives_back_free_memory(sim: SimulatorBackend, mem: ByHand) -> None:
    sim.occupy(TOTAL // 2)
    assert sim.device.memory_info().free == TOTAL // 2
    assert sim.used == 0, "memory of other processes is not ours"
    stream = sim.device.create_stream()
    with pytest.raises(AllocationError, match="out of memory"):
        mem.allocate((TOTAL // 2 // 8 + 1,), F8, MemoryKind.DEVICE, stream)
    with pytest.raises(ValueError, match="cannot occupy"):
        sim.occupy(TOTAL // 2 + 1)
    with pytest.raises(ValueError, match="cannot occupy"):
        sim.occupy(-(TOTAL // 2) - 1)
    sim.occupy(-(TOTAL // 2))
    assert sim.device.memory_info().free == TOTAL


def test_reserved_memory_and_bad_settings() -> None:
    sim = SimulatorBackend(total=1000, reserved=400)
    assert sim.device.memory_info().free == 600
    for kwargs in ({"total": 0}, {"reserved": -1}, {"total": 10, "reserved": 11}, {"latency": -1.0}, {"granule": -1}):
        with pytest.raises(ConfigurationError) as info:  # a ValueError too, as it always was
            SimulatorBackend(**kwargs)  # type: ignore[arg-type]
        name, value = next((k, v) for k, v in kwargs.items() if k != "total" or len(kwargs) == 1)
        assert f"{name} must be" in str(info.value) and repr(value) in str(info.value)


# issue 11 item 17: the simulator's own API refuses bad settings with aiocubie's errors
@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"total": "1GB"}, "'1GB'"),
        ({"total": -1}, "-1"),
        ({"total": 1.5e9}, "1500000000.0"),
        ({"total": True}, "True"),
        ({"total": 10**400}, "an integer of 401 digits"),
        ({"latency": "fast"}, "'fast'"),
        ({"latency": float("nan")}, "nan"),
        ({"latency": float("inf")}, "inf"),
        ({"granule": 0.5}, "0.5"),
        ({"reserved": None}, "None"),
        ({"array_type": "torch"}, "'torch'"),
    ],
)
def test_bad_settings_are_configuration_errors(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        SimulatorBackend(**kwargs)  # type: ignore[arg-type]
    assert named in str(info.value)


@pytest.mark.parametrize(
    "bad",
    [{"h2d_bandwidth": "fast"}, {"d2h_bandwidth": None}, {"copy_latency": float("nan")}, {"kernel_latency": True}],
    ids=repr,
)
def test_engines_refuse_a_value_that_is_not_a_number(bad: dict[str, object]) -> None:
    """Issue 22, item 9: Engines(h2d_bandwidth="fast") was accepted and failed later on a stream's thread."""
    name, value = next(iter(bad.items()))
    with pytest.raises(ConfigurationError, match=rf"Engines\({name}={value!r}\)"):
        Engines(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args, named",
    [
        (("alloc",), "'alloc'"),
        ((None,), "None"),
        ((["copy"],), "['copy']"),
        (("copy",), None),
    ],
)
def test_unknown_fault_sites_are_configuration_errors(
    sim: SimulatorBackend, args: tuple[object, ...], named: str | None
) -> None:
    if named is None:
        sim.faults.inject(*args)  # type: ignore[arg-type]
        return
    with pytest.raises(ConfigurationError, match="unknown fault site") as info:
        sim.faults.inject(*args)  # type: ignore[arg-type]
    assert named in str(info.value)


@pytest.mark.parametrize(
    "rule, named",
    [
        ({"after": -1}, "after must be"),
        ({"after": "2"}, "after must be"),
        ({"after": 1.5}, "after must be"),
        ({"times": 0}, "times must be"),
        ({"times": "forever"}, "times must be"),
        ({"probability": 1.5}, "probability must be"),
        ({"probability": float("nan")}, "probability must be"),
        ({"probability": "0.5"}, "probability must be"),
        ({"seed": "x"}, "seed must be"),
        ({"seed": 1.5}, "seed must be"),
    ],
)
def test_bad_fault_rules_are_configuration_errors_and_inject_nothing(
    sim: SimulatorBackend, mem: ByHand, rule: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        sim.faults.inject("allocate", **rule)  # type: ignore[arg-type]
    mem.allocate((4,), np.dtype("f4"), MemoryKind.DEVICE, sim.device.create_stream())  # nothing was injected
    assert sim.faults.fired["allocate"] == 0


@pytest.mark.parametrize("nbytes", ["1", 1.5, None, -1, TOTAL + 1])
def test_bad_occupy_is_a_configuration_error(sim: SimulatorBackend, nbytes: object) -> None:
    with pytest.raises(ConfigurationError, match="cannot occupy"):
        sim.occupy(nbytes)  # type: ignore[arg-type]
    assert sim.device.memory_info().free == TOTAL


# issue 11 item 15: the host running out of memory is an AllocationError, not numpy's MemoryError
@pytest.mark.parametrize("kind", [MemoryKind.HOST, MemoryKind.PINNED])
def test_host_memory_exhaustion_is_an_allocation_error(kind: MemoryKind) -> None:
    sim = SimulatorBackend(total=1 << 50)
    try:
        with pytest.raises(AllocationError, match="out of host memory"):
            sim.device.host_array((2**45,), np.dtype("u1"), kind)
        with pytest.raises(AllocationError, match="out of host memory"):
            ByHand(sim).allocate((2**45,), np.dtype("u1"), kind, sim.device.create_stream())
        assert sim.used == 0
    finally:
        sim.close()


@pytest.mark.parametrize("device", [np.array([1, 2]), -1, 1.0, True, "0"])
def test_advice_and_prefetch_refuse_a_bad_device(sim: SimulatorBackend, mem: ByHand, device: object) -> None:
    array = mem.allocate((4,), np.dtype("f4"), MemoryKind.MANAGED, sim.device.create_stream())
    with pytest.raises(InvalidRequestError, match="device must be"):
        sim.device.advise(array, "read_mostly", device)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="device must be"):
        sim.device.prefetch(array, device, sim.device.create_stream())  # type: ignore[arg-type]
    mem.free(array)


def test_allocation_out_of_memory_says_what_was_asked(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    mem.allocate((TOTAL // 8 - 1,), F8, MemoryKind.DEVICE, stream)
    with pytest.raises(AllocationError, match=r"asked for 16 bytes .* with 8 of 1048576 free"):
        mem.allocate((2,), F8, MemoryKind.DEVICE, stream)
    assert sim.used == TOTAL - 8


def test_host_array_is_zeroed(sim: SimulatorBackend) -> None:
    for kind in (MemoryKind.PINNED, MemoryKind.HOST):
        array = sim.device.host_array((3, 4), np.dtype("int32"), kind)
        assert array.shape == (3, 4) and array.dtype == np.int32
        assert not array.any()
    assert sim.used == 0


# -- streams and events ------------------------------------------------------------------------
def test_stream_runs_work_in_order(sim: SimulatorBackend) -> None:
    stream = sim.device.create_stream()
    gate = gate_stream(stream)
    seen: list[int] = []
    for i in range(50):
        stream.enqueue(functools.partial(seen.append, i))
    event = sim.device.record_event(stream)
    assert seen == [] and not event.query(), "nothing may run past a held stream"
    gate.set()
    event.synchronize()
    assert seen == list(range(50))
    assert event.query()


def test_event_completes_only_after_work_queued_before_it() -> None:
    sim = SimulatorBackend(total=TOTAL, latency=0.01)
    try:
        stream = sim.device.create_stream()
        src = np.random.default_rng(0).random(1000)
        dst = ByHand(sim).allocate(src.shape, src.dtype, MemoryKind.DEVICE, stream)
        gate = gate_stream(stream)
        sim.device.copy(src, dst, stream)
        seen_at_completion: list[np.ndarray[Any, Any]] = []
        called = threading.Event()

        def on_done() -> None:
            seen_at_completion.append(dst.get())  # on the stream's worker: no wait
            called.set()

        event = sim.device.record_event(stream)
        event.add_done_callback(on_done)
        assert not event.query()
        gate.set()
        assert called.wait(10)
        assert len(seen_at_completion) == 1
        np.testing.assert_array_equal(seen_at_completion[0], src)
    finally:
        sim.close()


def test_zero_is_queued_on_the_stream(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    array = mem.allocate((64,), F8, MemoryKind.DEVICE, stream)
    array[...] = 7.0
    gate = gate_stream(stream)
    sim.device.zero(array, stream)
    event = sim.device.record_event(stream)
    # A host read would wait for the stream: peek at the memory behind the array instead.
    assert (host_data(array) == 7.0).all(), "the fill must wait its turn on the stream"
    gate.set()
    event.synchronize()
    assert not array.any()


def test_streams_are_independent(sim: SimulatorBackend) -> None:
    held, free = sim.device.create_stream(), sim.device.create_stream()
    gate = gate_stream(held)
    try:
        sim.device.record_event(free).synchronize()  # would hang if streams shared one queue
        assert not sim.device.record_event(held).query()
    finally:
        gate.set()


def test_done_callback_called_once_before_and_after_completion(sim: SimulatorBackend) -> None:
    stream = sim.device.create_stream()
    gate = gate_stream(stream)
    event = sim.device.record_event(stream)
    calls: list[str] = []
    event.add_done_callback(lambda: calls.append("first"))
    event.add_done_callback(lambda: calls.append("second"))
    assert calls == []
    gate.set()
    event.synchronize()
    # the worker thread runs callbacks right after setting the flag the main thread waits on
    sim.device.record_event(stream).synchronize()
    assert calls == ["first", "second"]

    caller: list[threading.Thread] = []
    event.add_done_callback(lambda: caller.append(threading.current_thread()))
    assert caller == [threading.current_thread()], "an already-done event calls back at once, here"
    sim.device.record_event(stream).synchronize()
    assert calls == ["first", "second"] and len(caller) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", LOOPS)
async def test_launch_refuses_bad_arguments_at_the_call() -> None:
    """Issue 22, item 9: sim.launch(5), duration=-1 or nan, work=5 were accepted and failed on the stream's thread."""
    sim = SimulatorBackend(total=MiB)
    stream = sim.device.create_stream()
    for args, kwargs, named in [
        ((5,), {}, "got 5"),
        ((stream,), {"duration": -1}, "got -1"),
        ((stream,), {"duration": float("nan")}, "got nan"),
        ((stream,), {"duration": "1"}, "got '1'"),
        ((stream, 5), {}, "got 5"),
    ]:
        with pytest.raises(InvalidRequestError, match=named):
            sim.launch(*args, **kwargs)  # type: ignore[arg-type]
    ran: list[int] = []
    sim.launch(stream, lambda: ran.append(1), duration=0.001, tag="ok")
    sim.device.record_event(stream).synchronize()
    assert ran == [1]
    assert [entry.tag for entry in sim.timeline[:3]] == ["ok"]  # a list: it slices
    sim.close()


# -- copies ------------------------------------------------------------------------------------
def test_copy_round_trip(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    host = np.random.default_rng(1).standard_normal((20, 30)).astype(np.float32)
    device = mem.allocate(host.shape, host.dtype, MemoryKind.DEVICE, stream)
    back = sim.device.host_array(host.shape, host.dtype, MemoryKind.PINNED)
    sim.device.copy(host, device, stream)
    sim.device.copy(device, back, stream)
    sim.device.record_event(stream).synchronize()
    np.testing.assert_array_equal(back, host)


@pytest.mark.parametrize(
    ("dst_shape", "dst_dtype"),
    [((10,), "float32"), ((2, 5), "float64"), ((11,), "float64")],
)
def test_copy_mismatch_raises(sim: SimulatorBackend, dst_shape: tuple[int, ...], dst_dtype: str) -> None:
    stream = sim.device.create_stream()
    src = np.zeros(10, np.float64)
    dst = np.zeros(dst_shape, dst_dtype)
    with pytest.raises(BackendError, match="shapes and dtypes must match"):
        sim.device.copy(src, dst, stream)


# -- faults ------------------------------------------------------------------------------------
def _operation(sim: SimulatorBackend, site: str) -> Callable[[], Any]:
    stream = sim.device.create_stream()
    mem = ByHand(sim)
    src, dst = np.ones(4), np.zeros(4)
    return {
        "allocate": lambda: mem.free(mem.allocate((4,), F8, MemoryKind.DEVICE, stream)),
        "record_event": lambda: sim.device.record_event(stream),
        "copy": lambda: sim.device.copy(src, dst, stream),
        "prefetch": lambda: sim.device.prefetch(dst, 0, stream),
    }[site]


def _outcomes(operation: Callable[[], Any], n: int) -> list[bool]:
    """True for each of ``n`` calls that raised an aiocubie error."""
    failed = []
    for _ in range(n):
        try:
            operation()
        except (AllocationError, BackendError):
            failed.append(True)
        else:
            failed.append(False)
    return failed


SITES = ["allocate", "record_event", "copy", "prefetch"]


@pytest.mark.parametrize("site", SITES)
def test_fault_after_and_times(sim: SimulatorBackend, site: str) -> None:
    operation = _operation(sim, site)
    sim.faults.inject(site, after=2, times=2)  # type: ignore[arg-type]
    assert _outcomes(operation, 6) == [False, False, True, True, False, False]
    assert sim.faults.fired[site] == 2
    assert sim.used == 0


@pytest.mark.parametrize("site", SITES)
def test_fault_forever_until_cleared(sim: SimulatorBackend, site: str) -> None:
    operation = _operation(sim, site)
    sim.faults.inject(site, times=None)  # type: ignore[arg-type]
    assert _outcomes(operation, 5) == [True] * 5
    sim.faults.clear()
    assert _outcomes(operation, 2) == [False, False]


@pytest.mark.parametrize("site", SITES)
def test_fault_probability_is_reproducible_with_a_seed(sim: SimulatorBackend, site: str) -> None:
    operation = _operation(sim, site)
    sim.faults.inject(site, probability=0.3, times=None, seed=42)  # type: ignore[arg-type]
    outcomes = _outcomes(operation, 200)
    rng = random.Random(42)
    assert outcomes == [rng.random() < 0.3 for _ in range(200)]
    assert 0 < sum(outcomes) < 200
    assert sim.faults.fired[site] == sum(outcomes)


def test_faults_only_hit_their_site(sim: SimulatorBackend) -> None:
    sim.faults.inject("copy", times=None)
    assert _outcomes(_operation(sim, "allocate"), 3) == [False] * 3
    assert _outcomes(_operation(sim, "copy"), 1) == [True]


def test_allocation_fault_message_and_no_leak(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    sim.faults.inject("allocate")
    with pytest.raises(AllocationError, match=r"injected fault: allocating 80 bytes of device"):
        mem.allocate((10,), F8, MemoryKind.DEVICE, stream)
    assert sim.used == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"site": "free"},
        {"site": "copy", "after": -1},
        {"site": "copy", "times": 0},
        {"site": "copy", "probability": 1.5},
    ],
)
def test_bad_fault_rules_raise(sim: SimulatorBackend, kwargs: dict[str, Any]) -> None:
    site = kwargs.pop("site")
    with pytest.raises(ValueError):
        sim.faults.inject(site, **kwargs)


# -- managed memory ----------------------------------------------------------------------------
def test_prefetch_is_ordered_and_advice_is_checked(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    array = mem.allocate((16,), F8, MemoryKind.MANAGED, stream)
    gate = gate_stream(stream)
    sim.device.prefetch(array, 0, stream)
    event = sim.device.record_event(stream)
    assert not event.query()
    gate.set()
    event.synchronize()
    for advice in ("preferred_location", "accessed_by", "read_mostly"):
        sim.device.advise(array, advice, 0)
    with pytest.raises(BackendError, match="unknown managed-memory advice"):
        sim.device.advise(array, "fast_please", 0)  # type: ignore[arg-type]


# -- context resets ----------------------------------------------------------------------------
def test_reset_forgets_memory_and_closes_streams(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    array = mem.allocate((100,), F8, MemoryKind.DEVICE, stream)
    sim.device.reset()
    assert sim.resets == 1
    assert sim.used == 0 and sim.device.memory_info().free == TOTAL
    with pytest.raises(BackendError, match="after a context reset"):  # its block went with the context
        mem.free(array)
    assert stream.closed
    with pytest.raises(BackendError, match="closed by a context reset"):
        sim.device.record_event(stream)
    with pytest.raises(BackendError, match="closed by a context reset"):
        sim.device.copy(np.ones(2), np.ones(2), stream)
    sim.device.record_event(sim.device.create_stream()).synchronize()  # a new stream works


def test_reset_closes_streams_after_their_queued_work(sim: SimulatorBackend) -> None:
    stream = sim.device.create_stream()
    gate = gate_stream(stream)
    event = sim.device.record_event(stream)
    sim.device.reset()
    gate.set()
    event.synchronize()  # work queued before the reset still completes
    with pytest.raises(BackendError):
        stream.enqueue(lambda: None)


def test_unknown_allocator_resets_nothing(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    mem.allocate((100,), F8, MemoryKind.DEVICE, stream)
    with pytest.raises(UnknownAllocatorError, match="use one of 'default', 'driver', 'cupy', 'cupy_async', 'numba'"):
        sim.device.create_resource("jemalloc")
    assert sim.resource.name == "driver" and sim.resets == 0 and sim.used == 800
    sim.device.record_event(stream).synchronize()


def test_copies_refuse_read_only_and_non_contiguous_arrays(sim: SimulatorBackend, mem: ByHand) -> None:
    stream = sim.device.create_stream()
    device = mem.allocate((4, 6), F8, MemoryKind.DEVICE, stream)
    read_only = np.zeros((4, 6))
    read_only.flags.writeable = False
    with pytest.raises(BackendError, match="read-only"):
        sim.device.copy(device, read_only, stream)
    with pytest.raises(BackendError, match="non-contiguous source"):
        sim.device.copy(np.zeros((6, 4)).T, device, stream)


def test_a_failing_work_item_does_not_stop_its_stream(sim: SimulatorBackend) -> None:
    stream = sim.device.create_stream()

    def boom() -> None:
        raise RuntimeError("work failed")

    stream.enqueue(boom)
    event = sim.device.record_event(stream)
    event.synchronize()  # would block forever if the worker had died
    assert event.query()


def test_an_unreferenced_stream_stops_its_worker() -> None:
    import gc

    stream = SimulatorBackend(total=TOTAL).device.create_stream()
    name = f"aiocubie-sim-stream-{stream.id}"
    (worker,) = [t for t in threading.enumerate() if t.name == name]
    del stream
    gc.collect()
    worker.join(timeout=10)
    assert not worker.is_alive()


# -- use after free, when the engines run it -----------------------------------------------------
def test_a_copy_queued_on_another_stream_that_runs_after_the_free_sticks(sim: SimulatorBackend, mem: ByHand) -> None:
    # the free is ordered on the block's stream only: a copy queued on another stream before the
    # release, still waiting when the free runs, would write memory the pool handed on
    home, other = sim.device.create_stream(), sim.device.create_stream()
    array = mem.allocate((64,), F8, MemoryKind.DEVICE, home)
    gate = gate_stream(other)
    sim.device.copy(np.full(64, 3.0), array, other)
    mem.free(array)
    home.synchronize()  # the free ran
    gate.set()
    other.synchronize()
    assert (host_data(array).view(np.uint8) == 0xFF).all(), "the copy wrote freed memory"
    assert sim.device.sticky is not None and "released after it was queued" in sim.device.sticky
    with pytest.raises(BackendError, match="unusable"):
        sim.device.record_event(home)
    with pytest.raises(BackendError, match="unusable"):
        sim.device.copy(np.zeros(64), mem.allocate((64,), F8, MemoryKind.DEVICE, home), home)
    sim.device.reset()  # as a context reset clears a CUDA context's sticky error
    assert sim.device.sticky is None


def test_work_queued_on_the_blocks_stream_before_the_free_runs_before_it(sim: SimulatorBackend, mem: ByHand) -> None:
    # a stream-ordered free: a fill, a copy and a kernel queued on the block's own stream first are fine
    stream = sim.device.create_stream()
    array = mem.allocate((64,), F8, MemoryKind.DEVICE, stream)
    out = sim.device.host_array((64,), F8, MemoryKind.PINNED)
    seen: list[float] = []
    gate = gate_stream(stream)
    sim.device.zero(array, stream)
    sim.device.copy(np.full(64, 5.0), array, stream)
    sim.launch(stream, lambda: seen.append(float(array.sum())))
    sim.device.copy(array, out, stream)
    mem.free(array)
    with pytest.raises(ReleasedError):  # the host may not touch it from the release on
        array.get()
    gate.set()
    stream.synchronize()
    assert seen == [320.0] and (out == 5.0).all()
    assert sim.device.sticky is None
    assert (host_data(array).view(np.uint8) == 0xFF).all(), "poisoned once the stream reached the free"


def test_a_kernel_that_runs_on_freed_memory_sticks(sim: SimulatorBackend, mem: ByHand) -> None:
    home, other = sim.device.create_stream(), sim.device.create_stream()
    array = mem.allocate((8,), F8, MemoryKind.DEVICE, home)
    gate = gate_stream(other)
    sim.launch(other, lambda: array.fill(1.0), tag="late")
    mem.free(array)
    home.synchronize()
    gate.set()
    other.synchronize()
    assert sim.device.sticky is not None and "'late'" in sim.device.sticky


def test_a_simulator_closes_its_streams_when_its_with_block_ends() -> None:
    with SimulatorBackend(total=1 << 20) as sim:
        stream = sim.device.create_stream()
        worker = stream._worker
        assert worker.is_alive()
    worker.join(2)  # a closed stream's thread ends after the work queued before
    assert stream.closed and not worker.is_alive()
