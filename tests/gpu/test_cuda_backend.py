"""CudaBackend on a real GPU, used directly (no manager): every allocator, kind, copy and event path."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import numpy as np
import pytest
from backend_contract import to_numpy

from aiocubie._errors import AllocationError, BackendError, InvalidRequestError, UnknownAllocatorError
from aiocubie._requests import MemoryKind

pytestmark = pytest.mark.gpu

GiB = 1 << 30
rng = np.random.default_rng()


def to_host(array: Any) -> np.ndarray[Any, Any]:
    """A host copy of any array kind and type (the stream must be synchronized first)."""
    return to_numpy(array)


# -- allocation --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MemoryKind))
def test_allocate_zero_free_every_kind(backend: Any, kind: MemoryKind) -> None:
    stream = backend.create_stream()
    dtype = np.dtype(np.float32)
    array = backend.allocate((4, 1000), dtype, kind, stream)
    assert array.shape == (4, 1000) and array.dtype == dtype
    assert backend.nbytes(array) == 16_000
    poison = np.full((4, 1000), np.nan, dtype)  # so that zero() must really write
    if isinstance(array, np.ndarray):
        array[...] = poison
    else:
        backend.copy(poison, array, stream)
    backend.zero(array, stream)
    stream.synchronize()
    assert np.array_equal(to_host(array), np.zeros((4, 1000), dtype))
    backend.free(array)


def test_memory_info_is_sane_and_tracks_allocations(backend: Any) -> None:
    before = backend.memory_info()
    assert 0 < before.free <= before.total
    assert backend.granule == 2 << 20 and backend.device_name
    array = backend.allocate((GiB,), np.dtype(np.uint8), MemoryKind.DEVICE, backend.create_stream())
    after = backend.memory_info()
    assert after.total == before.total
    assert before.free - after.free >= GiB * 0.9
    backend.free(array)


def test_host_array(backend: Any) -> None:
    for kind in (MemoryKind.PINNED, MemoryKind.HOST):
        array = backend.host_array((3, 5), np.dtype(np.int64), kind)
        assert isinstance(array, np.ndarray) and not array.any()
    with pytest.raises(InvalidRequestError):
        backend.host_array((3,), np.dtype(np.int64), MemoryKind.DEVICE)


def test_device_oom_becomes_allocation_error(backend: Any) -> None:
    total = backend.memory_info().total
    with pytest.raises(AllocationError, match=f"{total + GiB} bytes") as info:
        backend.allocate((total + GiB,), np.dtype(np.uint8), MemoryKind.DEVICE, backend.create_stream())
    assert info.value.__cause__ is not None
    assert "free" in str(info.value)
    # The device still works after the failure.
    backend.allocate((1024,), np.dtype(np.uint8), MemoryKind.DEVICE, backend.create_stream())


def test_managed_beyond_free_is_refused_before_the_driver(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from numba import cuda

    def must_not_run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("managed_array was called for a request larger than free memory")

    real = cuda.managed_array
    monkeypatch.setattr(cuda, "managed_array", must_not_run)
    free = backend.memory_info().free
    with pytest.raises(AllocationError, match="refusing"):
        backend.allocate((free + GiB,), np.dtype(np.uint8), MemoryKind.MANAGED, 0)
    monkeypatch.setattr(cuda, "managed_array", real)
    small = backend.allocate((1 << 20,), np.dtype(np.uint8), MemoryKind.MANAGED, 0)
    assert backend.nbytes(small) == 1 << 20


# -- allocators --------------------------------------------------------------------------


def test_set_allocator_swaps_the_numba_plugin(cuda_backend: Any, cu: Any) -> None:
    from numba import cuda

    pytest.importorskip("cupy")
    start = cuda_backend.allocator
    stream = cuda_backend.create_stream()
    before = cuda_backend.allocate((1000,), np.dtype(np.float64), MemoryKind.DEVICE, stream)
    cuda_backend.copy(np.arange(1000.0), before, stream)
    for name, plugin in [("cupy", cu._CupyPoolManager), ("cupy_async", cu._CupyAsyncPoolManager), ("default", None)]:
        cuda_backend.set_allocator(name)
        assert cuda_backend.allocator == name
        manager = cuda.current_context().memory_manager
        assert type(manager) is plugin if plugin else type(manager).__name__ == "NumbaCUDAMemoryManager"
        stream = cuda_backend.create_stream()
        array = cuda_backend.allocate((1000,), np.dtype(np.float64), MemoryKind.DEVICE, stream)
        if plugin:
            assert manager.pool.used_bytes() >= 8000
        cuda_backend.zero(array, stream)
        stream.synchronize()
        assert not to_host(array).any()
        del array
    # The swap never destroys the context: an array from before still reads back.
    assert np.array_equal(to_host(before), np.arange(1000.0))
    cuda_backend.set_allocator(start)


def test_unknown_or_unavailable_allocator_fails(cuda_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    start = cuda_backend.allocator
    with pytest.raises(UnknownAllocatorError, match="rmm"):
        cuda_backend.set_allocator("rmm")
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` fail
    with pytest.raises(UnknownAllocatorError, match=r"aiocubie\[cuda13\]"):
        cuda_backend.set_allocator("cupy_async")
    assert cuda_backend.allocator == start


def test_current_cupy_stream_binds_the_numba_stream(cuda_backend: Any, cu: Any) -> None:
    cupy = pytest.importorskip("cupy")
    stream = cuda_backend.create_stream()
    with cu.current_cupy_stream(stream) as cupy_stream:
        assert cupy.cuda.get_current_stream().ptr == int(stream.handle) == cupy_stream.ptr
    assert cupy.cuda.get_current_stream().ptr != int(stream.handle)


# -- events ------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["thread", "host_func"])
def test_event_callback_fires_from_another_thread(cuda_backend: Any, kernels: Any, mechanism: str) -> None:
    cuda_backend.event_mechanism = mechanism
    try:
        stream = cuda_backend.create_stream()
        flag = cuda_backend.allocate((1,), np.dtype(np.int32), MemoryKind.MAPPED, stream)
        cuda_backend.zero(flag, stream)  # on its own stream: a CuPy fill would run on the legacy stream
        kernels.sleep[1, 1, stream](flag, 50_000_000)  # about 50 ms
        event = cuda_backend.record_event(stream)
        assert not event.query()
        fired: list[int] = []
        done = threading.Event()

        def callback() -> None:
            fired.append(threading.get_ident())
            done.set()

        event.add_done_callback(callback)
        assert done.wait(10), f"{mechanism}: the callback never ran"
        assert event.query() and flag[0] == 1
        assert fired == [fired[0]] and fired[0] != threading.get_ident()
        # An event already complete calls back at once, on the calling thread.
        fired.clear()
        event.add_done_callback(callback)
        assert fired == [threading.get_ident()]
    finally:
        cuda_backend.event_mechanism = "thread"


@pytest.mark.parametrize("mechanism", ["thread", "host_func"])
def test_event_resolves_an_asyncio_future(cuda_backend: Any, kernels: Any, mechanism: str) -> None:
    cuda_backend.event_mechanism = mechanism

    from numba import cuda

    async def main() -> None:
        loop = asyncio.get_running_loop()
        streams = [cuda_backend.create_stream() for _ in range(3)]
        flags = [cuda_backend.allocate((1,), np.dtype(np.int32), MemoryKind.MAPPED, s) for s in streams]
        futures = []
        # Longest first: each stream's event must resolve on its own, not behind the others.
        for ms, stream, flag in zip((300, 100, 10), streams, flags):
            cuda_backend.zero(flag, stream)  # on its own stream: a CuPy fill would run on the legacy stream
            # A CuPy array's interface names CuPy's current stream (the legacy one here), which numba
            # synchronizes before a launch, so launches would wait for each other: view it unsynced.
            view = cuda.from_cuda_array_interface(flag.__cuda_array_interface__, owner=flag, sync=False)
            kernels.sleep[1, 1, stream](view, ms * 1_000_000)
            fut = loop.create_future()
            cuda_backend.record_event(stream).add_done_callback(
                lambda fut=fut: loop.call_soon_threadsafe(fut.set_result, None)
            )
            futures.append(fut)
        first = await asyncio.wait_for(asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED), 10)
        assert futures[2] in first[0] and not futures[0].done()
        await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert [int(f[0]) for f in flags] == [1, 1, 1]

    try:
        asyncio.run(main())
    finally:
        cuda_backend.event_mechanism = "thread"


@pytest.mark.parametrize("mechanism", ["thread", "host_func"])
def test_reset_runs_pending_callbacks_first(cuda_backend: Any, kernels: Any, mechanism: str) -> None:
    cuda_backend.event_mechanism = mechanism
    try:
        stream = cuda_backend.create_stream()
        flag = cuda_backend.allocate((1,), np.dtype(np.int32), MemoryKind.MAPPED, stream)
        kernels.sleep[1, 1, stream](flag, 20_000_000)
        done = threading.Event()
        cuda_backend.record_event(stream).add_done_callback(done.set)
        del flag, stream
        cuda_backend.reset()
        assert done.is_set()
        stream = cuda_backend.create_stream()
        event = cuda_backend.record_event(stream)
        event.synchronize()
        assert event.query()
    finally:
        cuda_backend.event_mechanism = "thread"


# -- copies ------------------------------------------------------------------------------


@pytest.mark.parametrize("host_kind", [MemoryKind.PINNED, MemoryKind.HOST])
@pytest.mark.parametrize("device_kind", [MemoryKind.DEVICE, MemoryKind.MANAGED])
def test_copies_round_trip(backend: Any, host_kind: MemoryKind, device_kind: MemoryKind) -> None:
    stream = backend.create_stream()
    shape, dtype = (1000, 37), np.dtype(np.float64)
    src = backend.host_array(shape, dtype, host_kind)
    src[...] = rng.standard_normal(shape)
    dev = backend.allocate(shape, dtype, device_kind, stream)
    dst = backend.host_array(shape, dtype, host_kind)
    dst[...] = np.nan
    backend.copy(src, dev, stream)
    backend.copy(dev, dst, stream)
    backend.record_event(stream).synchronize()
    assert np.array_equal(dst, src)


def test_copy_rejects_mismatches(backend: Any) -> None:
    stream = backend.create_stream()
    dev = backend.allocate((10,), np.dtype(np.float32), MemoryKind.DEVICE, stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        backend.copy(np.zeros(11, np.float32), dev, stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        backend.copy(dev, np.zeros(10, np.float64), stream)
    with pytest.raises(BackendError, match="contiguous"):
        backend.copy(np.zeros(20, np.float32)[::2], dev, stream)


# -- managed memory ----------------------------------------------------------------------


def test_prefetch_and_advise_managed(backend: Any, kernels: Any) -> None:
    stream = backend.create_stream()
    n = 16 << 20  # 64 MiB of float32
    array = backend.allocate((n,), np.dtype(np.float32), MemoryKind.MANAGED, stream)
    expected = rng.standard_normal(n).astype(np.float32)
    backend.copy(expected, array, stream)
    for advice in ("preferred_location", "accessed_by", "read_mostly"):
        backend.advise(array, advice, 0)
    backend.advise(array, "accessed_by", None)
    backend.prefetch(array, 0, stream)
    kernels.add_one[(n + 255) // 256, 256, stream](array)
    backend.prefetch(array, None, stream)
    backend.record_event(stream).synchronize()
    assert np.array_equal(to_host(array), expected + np.float32(1))
    with pytest.raises(BackendError, match="managed"):
        backend.prefetch(backend.allocate((4,), np.dtype(np.float32), MemoryKind.DEVICE, stream), 0, stream)
    with pytest.raises(BackendError, match="advice"):
        backend.advise(array, "nonsense", 0)


# -- a real kernel over a chunked array --------------------------------------------------


def test_kernel_writes_a_chunked_array_chunk_by_chunk(backend: Any, kernels: Any) -> None:
    rows, runs, chunks = 8, 1_000_003, 7
    chunk_length = -(-runs // chunks)
    stream = backend.create_stream()
    chunk = backend.allocate((rows, chunk_length), np.dtype(np.float64), MemoryKind.DEVICE, stream)
    staging = backend.host_array((rows, chunk_length), np.dtype(np.float64), MemoryKind.PINNED)
    result = np.full((rows, runs), np.nan)
    for start in range(0, runs, chunk_length):
        length = min(chunk_length, runs - start)
        backend.zero(chunk, stream)
        kernels.fill_chunk[(rows, -(-chunk_length // 128)), (1, 128), stream](chunk, start, runs)
        backend.copy(chunk, staging, stream)
        backend.record_event(stream).synchronize()
        result[:, start : start + length] = staging[:, :length]
    expected = np.arange(rows)[:, None] * runs + np.arange(runs)[None, :] + 1
    assert np.array_equal(result, expected)


def test_cuda_usable_names_the_device(cu: Any, cuda_backend: Any) -> None:
    usable, why = cu.cuda_usable()
    assert usable and cuda_backend.device_name in why
