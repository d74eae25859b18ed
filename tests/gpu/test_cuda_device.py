"""CudaDevice, each CUDA resource and CuPy's array maker on a real GPU, used directly (no manager).

Every resource (``driver``, ``cupy``, ``cupy_async``, ``numba`` where numba-cuda is installed) in
turn: every kind, copies, fills, events and their callbacks, managed memory, errors. Kernels are
CuPy's, so this runs without numba-cuda.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import numpy as np
import pytest
from gpukit import alone_on_device, to_host

from aiocubie._errors import (
    AllocationError,
    BackendError,
    ConfigurationError,
    InvalidRequestError,
    OutOfMemoryError,
    UnknownAllocatorError,
)
from aiocubie._requests import MemoryKind

pytestmark = pytest.mark.gpu

GiB = 1 << 30
rng = np.random.default_rng()


# -- the device ----------------------------------------------------------------------------


def test_device_attributes(device: Any, cu: Any) -> None:
    assert device.name == "cuda" and device.device_id == 0 and device.device_name
    assert device.granule == 2 << 20
    assert device.default_resource == cu.DEFAULT_RESOURCE in device.resources
    assert "driver" in device.resources
    info = device.memory_info()
    assert 0 < info.free <= info.total
    usable, why = cu.cuda_usable()
    assert usable and device.device_name in why


def test_a_device_that_does_not_exist_is_refused(cu: Any) -> None:
    count = cu.driver_device_count()[0]
    with pytest.raises(ConfigurationError, match=f"sees {count}"):
        cu.CudaDevice(count)


def test_unknown_or_unavailable_resource_fails(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rmm", None)  # makes `import rmm` fail
    with pytest.raises(UnknownAllocatorError, match=r'pip install "aiocubie\[rmm\]"'):
        device.create_resource("rmm")
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` fail
    with pytest.raises(UnknownAllocatorError, match=r"aiocubie\[cuda13\]"):
        device.create_resource("cupy_async")


def test_activation_is_kept_not_pushed_and_popped(device: Any) -> None:
    from cuda.bindings import driver as binding

    def current() -> int:
        return int(binding.cuCtxGetCurrent()[1])

    # Stream-ordered work needs no current context: from a thread with none, it still runs.
    stream = device.create_stream()
    src = device.host_array((1 << 20,), np.uint8, MemoryKind.PINNED)
    src[:] = 7
    dst = device.host_array((1 << 20,), np.uint8, MemoryKind.PINNED)
    device.record_event(stream).synchronize()  # its event goes back to the spares when dropped
    seen: list[Any] = []

    def bare() -> None:
        seen.append(current())
        device.copy(src, dst, stream)
        event = device.record_event(stream)  # a spare event: no new one is created
        event.synchronize()
        seen.append(event.query())
        seen.append(current())  # nothing was made current for those calls

        # a thread whose context someone else made current: cuda.core's per-thread Device was
        # never set current here, and streams must still be made
        binding.cuCtxSetCurrent(device.context)
        seen.append(device.create_stream() is not None)

    thread = threading.Thread(target=bare)
    thread.start()
    thread.join()
    assert (dst == 7).all()
    assert seen == [0, True, 0, True]
    # What reads the current context makes the device current once, and leaves it so.
    binding.cuCtxSetCurrent(binding.CUcontext(0))
    device.memory_info()
    assert current() == int(device.context)
    with device.activate():
        assert current() == int(device.context)
    assert current() == int(device.context)


def test_host_array(device: Any) -> None:
    for kind in (MemoryKind.PINNED, MemoryKind.HOST):
        array = device.host_array((3, 5), np.dtype(np.int64), kind)
        assert isinstance(array, np.ndarray) and array.shape == (3, 5) and not array.any()
        assert device.is_pinned(array) == (kind is MemoryKind.PINNED)
        assert device.is_pinned(array[1:]) == (kind is MemoryKind.PINNED)  # a view of pinned memory is pinned
    with pytest.raises(InvalidRequestError):
        device.host_array((3,), np.dtype(np.int64), MemoryKind.DEVICE)


def test_pinned_pool_hands_out_pinned_buffers(device: Any) -> None:
    buffer = device.pinned_pool.acquire(1 << 20)
    try:
        assert device.is_pinned(buffer) and buffer.nbytes >= 1 << 20
    finally:
        device.pinned_pool.release(buffer)


# -- each resource ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MemoryKind), ids=lambda k: k.value)
def test_allocate_zero_every_kind(device: Any, resource: Any, alloc: Any, kind: MemoryKind) -> None:
    stream = device.create_stream()
    dtype = np.dtype(np.float32)
    array = alloc((4, 1000), dtype, kind, stream)
    assert array.shape == (4, 1000) and array.dtype == dtype and array.nbytes == 16_000
    if kind in (MemoryKind.HOST, MemoryKind.PINNED):
        assert isinstance(array, np.ndarray)
        assert device.is_pinned(array) == (kind is MemoryKind.PINNED)
    else:
        assert type(array).__module__.startswith("cupy")
    poison = np.full((4, 1000), np.nan, dtype)  # so that zero() must really write
    if isinstance(array, np.ndarray):
        array[...] = poison
    else:
        device.copy(poison, array, stream)
    device.zero(array, stream)
    device.record_event(stream).synchronize()
    assert np.array_equal(to_host(array), np.zeros((4, 1000), dtype))


def test_empty_blocks(device: Any, resource: Any, alloc: Any) -> None:
    stream = device.create_stream()
    for kind in MemoryKind:
        array = alloc((0, 3), np.float64, kind, stream)
        assert array.shape == (0, 3) and array.nbytes == 0
        device.zero(array, stream)


def test_memory_tracks_allocations_and_comes_back(device: Any, resource: Any, alloc: Any) -> None:
    alone_on_device("reads the device's free memory, which the others change meanwhile")
    stream = device.create_stream()
    resource.release_cached()
    before = device.memory_info()
    array = alloc((GiB,), np.uint8, MemoryKind.DEVICE, stream)
    device.record_event(stream).synchronize()
    after = device.memory_info()
    assert after.total == before.total
    assert before.free - after.free >= GiB * 0.9
    facts = resource.pool_facts()
    if resource.name != "numba":
        assert facts.in_use is not None and facts.in_use >= GiB and facts.held >= facts.in_use
    del array
    device.synchronize()
    freed = resource.release_cached()
    if resource.name != "rmm":  # RMM gives no cached bytes back on request; its default (cudaMalloc) frees at once
        assert freed >= GiB * 0.9, f"{resource.name}: release_cached gave back {freed} bytes"
    assert device.memory_info().free >= after.free + GiB * 0.9


def test_device_oom_becomes_out_of_memory(device: Any, resource: Any, alloc: Any) -> None:
    total = device.memory_info().total
    stream = device.create_stream()
    with pytest.raises(OutOfMemoryError, match="out of memory") as info:
        alloc((total + GiB,), np.uint8, MemoryKind.DEVICE, stream)
    assert info.value.__cause__ is not None or "OUT_OF_MEMORY" in str(info.value)
    assert "free" in str(info.value)
    # The device still works after the failure.
    alloc((1024,), np.uint8, MemoryKind.DEVICE, stream)


def test_managed_beyond_free_is_refused_before_the_driver(
    device: Any, resource: Any, alloc: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiocubie._backends._cuda import _resources

    def must_not_run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("cuMemAllocManaged was called for a request larger than free memory")

    real = _resources.ManagedAllocation
    monkeypatch.setattr(_resources, "ManagedAllocation", must_not_run)
    resource.release_cached()  # the refusal gives the pool's cache back first: count it as free
    free = device.memory_info().free
    with pytest.raises(AllocationError, match="refusing"):
        resource.allocate(free + GiB, MemoryKind.MANAGED, None)
    monkeypatch.setattr(_resources, "ManagedAllocation", real)
    small = alloc((1 << 20,), np.uint8, MemoryKind.MANAGED, 0)
    assert small.nbytes == 1 << 20


def test_an_array_keeps_its_block_alive(device: Any, resource: Any, arrays: Any) -> None:
    """deallocate() is the account letting go: the memory stays while an array over it lives."""
    stream = device.create_stream()
    block = resource.allocate(64 << 20, MemoryKind.DEVICE, stream)
    array = arrays.make(block, (16 << 20,), np.dtype(np.float32), stream)
    device.copy(np.arange(16 << 20, dtype=np.float32), array, stream)
    resource.deallocate(block)
    del block
    # Another allocation must not land on the live array's memory.
    other = arrays.make(
        resource.allocate(64 << 20, MemoryKind.DEVICE, stream), (16 << 20,), np.dtype(np.float32), stream
    )
    device.zero(other, stream)
    device.record_event(stream).synchronize()
    assert np.array_equal(to_host(array), np.arange(16 << 20, dtype=np.float32))


# -- events ----------------------------------------------------------------------------------


def test_event_callback_fires_from_another_thread(device: Any, resource: Any, alloc: Any, kernels: Any) -> None:
    stream = device.create_stream()
    flag = alloc((1,), np.int32, MemoryKind.MAPPED, stream)
    device.zero(flag, stream)
    kernels.sleep(stream, flag, 50_000_000)  # about 50 ms
    event = device.record_event(stream)
    assert not event.query()
    fired: list[int] = []
    done = threading.Event()

    def callback() -> None:
        fired.append(threading.get_ident())
        done.set()

    event.add_done_callback(callback)
    assert done.wait(10), "the callback never ran"
    assert event.query() and int(to_host(flag)[0]) == 1
    assert fired == [fired[0]] and fired[0] != threading.get_ident()
    # An event already complete calls back at once, on the calling thread.
    fired.clear()
    event.add_done_callback(callback)
    assert fired == [threading.get_ident()]


def test_events_resolve_asyncio_futures_each_on_its_own(device: Any, resource: Any, alloc: Any, kernels: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        streams = [device.create_stream() for _ in range(3)]
        flags = [alloc((1,), np.int32, MemoryKind.MAPPED, s) for s in streams]
        futures = []
        # Longest first: each stream's event must resolve on its own, not behind the others.
        for ms, stream, flag in zip((300, 100, 10), streams, flags):
            device.zero(flag, stream)
            kernels.sleep(stream, flag, ms * 1_000_000)
            fut = loop.create_future()
            device.record_event(stream).add_done_callback(
                lambda fut=fut: loop.call_soon_threadsafe(fut.set_result, None)
            )
            futures.append(fut)
        first = await asyncio.wait_for(asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED), 10)
        assert futures[2] in first[0] and not futures[0].done()
        await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert [int(to_host(f)[0]) for f in flags] == [1, 1, 1]

    asyncio.run(main())


def test_wait_event_orders_two_streams(device: Any, resource: Any, alloc: Any, kernels: Any) -> None:
    first, second = device.create_stream(), device.create_stream()
    flag = alloc((1,), np.int32, MemoryKind.MAPPED, first)
    device.zero(flag, first)
    kernels.sleep(first, flag, 50_000_000)
    device.wait_event(second, device.record_event(first))
    after = device.record_event(second)
    assert not after.query()
    after.synchronize()
    assert int(to_host(flag)[0]) == 1


def test_recycled_events_stay_correct(device: Any) -> None:
    stream = device.create_stream()
    for _ in range(100):
        event = device.record_event(stream)
        event.synchronize()
        assert event.query()
        del event


def test_reset_runs_pending_callbacks_first(device: Any, resource: Any, alloc: Any, kernels: Any) -> None:
    stream = device.create_stream()
    flag = alloc((1,), np.int32, MemoryKind.MAPPED, stream)
    kernels.sleep(stream, flag, 20_000_000)
    done = threading.Event()
    device.record_event(stream).add_done_callback(done.set)
    device.reset()
    assert done.is_set()
    stream = device.create_stream()
    event = device.record_event(stream)
    event.synchronize()
    assert event.query()


# -- copies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("host_kind", [MemoryKind.PINNED, MemoryKind.HOST], ids=lambda k: k.value)
@pytest.mark.parametrize(
    "device_kind", [MemoryKind.DEVICE, MemoryKind.MANAGED, MemoryKind.MAPPED], ids=lambda k: k.value
)
def test_copies_round_trip(
    device: Any, resource: Any, alloc: Any, host_kind: MemoryKind, device_kind: MemoryKind
) -> None:
    stream = device.create_stream()
    shape, dtype = (1000, 37), np.dtype(np.float64)
    src = device.host_array(shape, dtype, host_kind)
    src[...] = rng.standard_normal(shape)
    on_device = alloc(shape, dtype, device_kind, stream)
    other = alloc(shape, dtype, MemoryKind.DEVICE, stream)
    dst = device.host_array(shape, dtype, host_kind)
    dst[...] = np.nan
    device.copy(src, on_device, stream)
    device.copy(on_device, other, stream)  # device to device
    device.copy(other, dst, stream)
    device.record_event(stream).synchronize()
    assert np.array_equal(dst, src)


def test_copy_rejects_mismatches(device: Any, resource: Any, alloc: Any) -> None:
    stream = device.create_stream()
    array = alloc((10,), np.float32, MemoryKind.DEVICE, stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        device.copy(np.zeros(11, np.float32), array, stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        device.copy(array, np.zeros(10, np.float64), stream)
    with pytest.raises(BackendError, match="contiguous"):
        device.copy(np.zeros(20, np.float32)[::2], array, stream)


# -- managed memory --------------------------------------------------------------------------


def test_prefetch_and_advise_managed(device: Any, resource: Any, alloc: Any, kernels: Any) -> None:
    stream = device.create_stream()
    n = 16 << 20  # 64 MiB of float32
    array = alloc((n,), np.float32, MemoryKind.MANAGED, stream)
    expected = rng.standard_normal(n).astype(np.float32)
    device.copy(expected, array, stream)
    for advice in ("preferred_location", "accessed_by", "read_mostly"):
        device.advise(array, advice, 0)
    device.advise(array, "accessed_by", None)
    device.prefetch(array, 0, stream)
    kernels.add_one(stream, array)
    device.prefetch(array, None, stream)
    device.record_event(stream).synchronize()
    assert np.array_equal(to_host(array), expected + np.float32(1))
    with pytest.raises(BackendError, match="managed"):
        device.prefetch(alloc((4,), np.float32, MemoryKind.DEVICE, stream), 0, stream)
    with pytest.raises(BackendError, match="advice"):
        device.advise(array, "nonsense", 0)


# -- a kernel over a chunked array -----------------------------------------------------------


def test_kernel_writes_a_chunked_array_chunk_by_chunk(device: Any, resource: Any, alloc: Any, kernels: Any) -> None:
    rows, runs, chunks = 8, 1_000_003, 7
    chunk_length = -(-runs // chunks)
    stream = device.create_stream()
    chunk = alloc((rows, chunk_length), np.float64, MemoryKind.DEVICE, stream)
    staging = device.host_array((rows, chunk_length), np.dtype(np.float64), MemoryKind.PINNED)
    result = np.full((rows, runs), np.nan)
    for start in range(0, runs, chunk_length):
        length = min(chunk_length, runs - start)
        device.zero(chunk, stream)
        kernels.fill_chunk(stream, chunk, start, runs)
        device.copy(chunk, staging, stream)
        device.record_event(stream).synchronize()
        result[:, start : start + length] = staging[:, :length]
    expected = np.arange(rows)[:, None] * runs + np.arange(runs)[None, :] + 1
    assert np.array_equal(result, expected)


def test_current_cupy_stream_binds_the_stream(device: Any, cu: Any) -> None:
    cupy = pytest.importorskip("cupy")
    stream = device.create_stream()
    with cu.current_cupy_stream(stream) as cupy_stream:
        assert cupy.cuda.get_current_stream().ptr == int(stream.handle) == cupy_stream.ptr
    assert cupy.cuda.get_current_stream().ptr != int(stream.handle)


def test_the_cuda_package_imports_no_numba(cu: Any) -> None:
    import subprocess

    code = (
        "import sys, aiocubie._backends._cuda as cu; d = cu.CudaDevice(0); "
        "r = d.create_resource('driver'); s = d.create_stream(); "
        "a = cu.CupyArrays(0).make(r.allocate(64, __import__('aiocubie._requests', fromlist=['x']).MemoryKind.DEVICE, s), (16,), __import__('numpy').dtype('float32'), s); "
        # a None entry is scripts/no_numba hiding numba (not an import): only loaded modules count
        "assert not [m for m, v in sys.modules.items() if v is not None and m.split('.')[0] in ('numba', 'numba_cuda')], "
        "sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
