"""The backend contract: what every backend promises, for every kind x array type x allocator.

Not collected by itself: a test module imports its tests (``from backend_contract import *``)
and supplies a ``contract`` fixture (a :class:`Contract`). ``tests/test_backend_contract.py``
runs it on the simulator in CI, ``tests/gpu/test_contract_gpu.py`` unchanged on the GPU.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
import numpy as np
import pytest

from aiocubie import (
    AllocationError,
    BackendError,
    ConfigurationError,
    InvalidRequestError,
    MemoryKind,
    OutOfMemoryError,
    UnknownAllocatorError,
)
from aiocubie._backends import ALLOCATORS, ARRAY_TYPES, Backend, create_backend
from aiocubie._backends._base import parse_array_type

__all__ = [
    "DEVICE_SIDE",
    "HOST_SIDE",
    "Contract",
    "test_a_stream_waits_for_another_streams_event",
    "test_allocate_every_kind_gives_the_chosen_type",
    "test_allocation_beyond_the_device_fails_cleanly",
    "test_array_type_behaviour",
    "test_copies_round_trip_every_kind",
    "test_copy_rejects_mismatches",
    "test_cuda_array_interface_v3_with_stream",
    "test_event_callbacks_and_queries",
    "test_host_array",
    "test_managed_prefetch_and_advice",
    "test_pinned_host_memory_is_known",
    "test_pool_facts_and_releasing_cached_blocks",
    "test_protocol_attributes",
    "test_unknown_names_are_clear_errors",
    "test_zero_every_kind",
    "to_numpy",
]

DEVICE_SIDE = (MemoryKind.DEVICE, MemoryKind.MANAGED, MemoryKind.MAPPED)
HOST_SIDE = (MemoryKind.PINNED, MemoryKind.HOST)
rng = np.random.default_rng()


@attrs.define
class Contract:
    """What the contract tests get: a backend with its array type and allocator set."""

    backend: Backend
    array_type: str
    allocator: str


def to_numpy(array: Any) -> np.ndarray[Any, Any]:
    """A host copy of an array of any type (numpy, CuPy or its model, numba or its model)."""
    if isinstance(array, np.ndarray):
        return np.array(array)
    if hasattr(array, "copy_to_host"):
        return np.asarray(array.copy_to_host())
    return np.asarray(array.get())


def _sync(backend: Backend, stream: Any) -> None:
    backend.device.record_event(stream).synchronize()


def test_protocol_attributes(contract: Contract) -> None:
    backend = contract.backend
    assert backend.name in ("simulator", "cuda") and backend.device.device_name
    assert backend.allocator == contract.allocator in ALLOCATORS
    assert backend.array_type == contract.array_type in ARRAY_TYPES
    assert backend.device.granule >= 0
    info = backend.device.memory_info()
    assert 0 < info.free <= info.total


@pytest.mark.parametrize("kind", list(MemoryKind), ids=lambda k: k.value)
def test_allocate_every_kind_gives_the_chosen_type(contract: Contract, kind: MemoryKind) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    array = backend.allocate((4, 100), np.dtype(np.float32), kind, stream)
    assert array.shape == (4, 100) and array.dtype == np.float32
    assert backend.nbytes(array) == 1600
    if kind in HOST_SIDE:
        assert isinstance(array, np.ndarray) and array.flags.c_contiguous
    elif contract.array_type == "cupy":
        assert hasattr(array, "get") and not hasattr(array, "copy_to_host")
    else:
        assert hasattr(array, "copy_to_host") and not hasattr(array, "get")
    empty = backend.allocate((0, 3), np.dtype(np.float64), kind, stream)
    assert empty.shape == (0, 3) and backend.nbytes(empty) == 0
    backend.free(array)
    backend.free(empty)


@pytest.mark.parametrize("kind", list(MemoryKind), ids=lambda k: k.value)
def test_zero_every_kind(contract: Contract, kind: MemoryKind) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    array = backend.allocate((3, 1000), np.dtype(np.float64), kind, stream)
    backend.device.copy(np.full((3, 1000), np.nan), array, stream)  # so that zero() must really write
    backend.device.zero(array, stream)
    _sync(backend, stream)
    assert np.array_equal(to_numpy(array), np.zeros((3, 1000)))
    backend.free(array)


@pytest.mark.parametrize("host_kind", HOST_SIDE, ids=lambda k: k.value)
@pytest.mark.parametrize("device_kind", DEVICE_SIDE, ids=lambda k: k.value)
def test_copies_round_trip_every_kind(contract: Contract, device_kind: MemoryKind, host_kind: MemoryKind) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    shape, dtype = (500, 37), np.dtype(np.float64)
    src = backend.device.host_array(shape, dtype, host_kind)
    src[...] = rng.standard_normal(shape)
    dev = backend.allocate(shape, dtype, device_kind, stream)
    other = backend.allocate(shape, dtype, device_kind, stream)
    dst = backend.device.host_array(shape, dtype, host_kind)
    dst[...] = np.nan
    backend.device.copy(src, dev, stream)
    backend.device.copy(dev, other, stream)  # device to device
    backend.device.copy(other, dst, stream)
    _sync(backend, stream)
    assert np.array_equal(dst, src)
    assert np.array_equal(to_numpy(dev), src)


def test_copy_rejects_mismatches(contract: Contract) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    dev = backend.allocate((10,), np.dtype(np.float32), MemoryKind.DEVICE, stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        backend.device.copy(np.zeros(11, np.float32), dev, stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        backend.device.copy(dev, np.zeros(10, np.float64), stream)
    with pytest.raises(BackendError, match="contiguous"):
        backend.device.copy(np.zeros(20, np.float32)[::2], dev, stream)
    grid = backend.allocate((4, 6), np.dtype(np.float32), MemoryKind.DEVICE, stream)
    with pytest.raises(BackendError, match="contiguous"):
        backend.device.copy(grid[:, :3], np.zeros((4, 3), np.float32), stream)


@pytest.mark.parametrize("kind", DEVICE_SIDE, ids=lambda k: k.value)
def test_cuda_array_interface_v3_with_stream(contract: Contract, kind: MemoryKind) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    array = backend.allocate((8, 4), np.dtype(np.int32), kind, stream)
    interface = array.__cuda_array_interface__
    assert interface["version"] == 3
    assert interface["shape"] == (8, 4) and np.dtype(interface["typestr"]) == np.int32
    assert interface["data"][0] != 0 and interface["data"][1] is False
    assert interface["strides"] is None  # C-contiguous
    # The stream the consumer must order its work after: a real stream, never 0 (v3 forbids it).
    assert "stream" in interface and interface["stream"] not in (0,)
    view = array[:, 1:3].__cuda_array_interface__
    assert view["strides"] == (16, 4) and view["data"][0] == interface["data"][0] + 4


def test_event_callbacks_and_queries(contract: Contract) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    array = backend.allocate((1 << 16,), np.dtype(np.float64), MemoryKind.DEVICE, stream)
    backend.device.zero(array, stream)
    event = backend.device.record_event(stream)
    fired: list[int] = []
    done = threading.Event()

    def callback() -> None:
        fired.append(1)
        done.set()

    event.add_done_callback(callback)
    assert done.wait(10)
    event.synchronize()
    assert event.query() and fired == [1]
    event.add_done_callback(callback)  # already complete: at once, on this thread
    assert fired == [1, 1]


def test_a_stream_waits_for_another_streams_event(contract: Contract) -> None:
    # copy in on one stream, device-to-device on a second that waits for the first's event,
    # copy out on a third that waits for the second's: the data must arrive whole
    backend = contract.backend
    first, second, third = (
        backend.device.create_stream(),
        backend.device.create_stream(),
        backend.device.create_stream(),
    )
    shape, dtype = (1 << 20,), np.dtype(np.float32)
    src = backend.device.host_array(shape, dtype, MemoryKind.PINNED)
    src[...] = rng.standard_normal(shape)
    a = backend.allocate(shape, dtype, MemoryKind.DEVICE, first)
    b = backend.allocate(shape, dtype, MemoryKind.DEVICE, first)
    _sync(backend, first)
    dst = backend.device.host_array(shape, dtype, MemoryKind.PINNED)
    backend.device.copy(src, a, first)
    backend.device.wait_event(second, backend.device.record_event(first))
    backend.device.copy(a, b, second)
    backend.device.wait_event(third, backend.device.record_event(second))
    backend.device.copy(b, dst, third)
    _sync(backend, third)
    assert np.array_equal(dst, src)
    backend.device.wait_event(third, backend.device.record_event(third))  # an event already reached: no wait


def test_pinned_host_memory_is_known(contract: Contract) -> None:
    backend = contract.backend
    pinned = backend.device.host_array((64, 3), np.dtype(np.float64), MemoryKind.PINNED)
    assert backend.device.is_pinned(pinned) and backend.device.is_pinned(pinned[5:9])
    assert not backend.device.is_pinned(backend.device.host_array((64, 3), np.dtype(np.float64), MemoryKind.HOST))
    assert not backend.device.is_pinned(np.zeros(10))
    pool = backend.device.pinned_pool
    buffer = pool.acquire(1000)
    assert buffer.nbytes >= 1000 and backend.device.is_pinned(buffer)
    pool.release(buffer)
    assert pool.acquire(900) is buffer  # reused, not pinned again
    pool.release(buffer)


def test_host_array(contract: Contract) -> None:
    backend = contract.backend
    for kind in HOST_SIDE:
        array = backend.device.host_array((3, 5), np.dtype(np.int64), kind)
        assert isinstance(array, np.ndarray) and array.shape == (3, 5) and not array.any()


def test_managed_prefetch_and_advice(contract: Contract) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    array = backend.allocate((1 << 16,), np.dtype(np.float32), MemoryKind.MANAGED, stream)
    expected = rng.standard_normal(1 << 16).astype(np.float32)
    backend.device.copy(expected, array, stream)
    for advice in ("preferred_location", "accessed_by", "read_mostly"):
        backend.device.advise(array, advice, 0)
    backend.device.advise(array, "accessed_by", None)
    backend.device.prefetch(array, 0, stream)
    backend.device.prefetch(array, None, stream)
    _sync(backend, stream)
    assert np.array_equal(to_numpy(array), expected)
    with pytest.raises(BackendError, match="advice"):
        backend.device.advise(array, "nonsense", 0)  # type: ignore[arg-type]
    if backend.name == "cuda":  # the simulator does not track which memory is managed
        device = backend.allocate((4,), np.dtype(np.float32), MemoryKind.DEVICE, stream)
        with pytest.raises(BackendError, match="managed"):
            backend.device.prefetch(device, 0, stream)


def test_allocation_beyond_the_device_fails_cleanly(contract: Contract) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    total = backend.device.memory_info().total
    with pytest.raises(OutOfMemoryError):  # no room: the kind of failure the manager recovers from
        backend.allocate((total + (1 << 30),), np.dtype(np.uint8), MemoryKind.DEVICE, stream)
    with pytest.raises(AllocationError):
        backend.allocate((total + (1 << 30),), np.dtype(np.uint8), MemoryKind.MANAGED, stream)
    small = backend.allocate((1024,), np.dtype(np.uint8), MemoryKind.DEVICE, stream)  # still works
    assert backend.nbytes(small) == 1024


def test_pool_facts_and_releasing_cached_blocks(contract: Contract) -> None:
    backend = contract.backend
    stream = backend.device.create_stream()
    arrays = [backend.allocate((1 << 20,), np.dtype(np.uint8), MemoryKind.DEVICE, stream) for _ in range(4)]
    _sync(backend, stream)
    using = backend.pool_facts()
    if using.in_use is not None:  # an allocator that cannot say reports None
        assert using.held is not None and using.held >= using.in_use >= 4 << 20
    for array in arrays:
        backend.free(array)
    del arrays, array  # the last references: a GPU pool gets the blocks back now
    cached = backend.pool_facts()
    assert backend.release_cached() >= 0
    after = backend.pool_facts()
    if cached.cached is not None and after.cached is not None:
        assert after.cached <= cached.cached
    assert after.largest_free is None or after.largest_free >= 0
    small = backend.allocate((1024,), np.dtype(np.uint8), MemoryKind.DEVICE, stream)  # still works
    assert backend.nbytes(small) == 1024


def test_unknown_names_are_clear_errors(contract: Contract) -> None:
    backend = contract.backend
    with pytest.raises(UnknownAllocatorError, match="'nope'"):
        backend.set_allocator("nope")
    assert backend.allocator == contract.allocator
    with pytest.raises(ConfigurationError, match=r"unknown array type 'torch'.*aiocubie\[cuda12\]"):
        parse_array_type("torch")
    with pytest.raises(ConfigurationError, match="unknown array type"):
        create_backend("simulator", array_type="jax")
    with pytest.raises(InvalidRequestError):
        backend.device.host_array((3,), np.dtype(np.int64), MemoryKind.DEVICE)


def test_array_type_behaviour(contract: Contract) -> None:
    """What the GPU refuses, every backend refuses; what users call, every backend supports."""
    backend = contract.backend
    stream = backend.device.create_stream()
    array = backend.allocate((4, 5), np.dtype(np.float64), MemoryKind.DEVICE, stream)
    backend.device.copy(np.arange(20.0).reshape(4, 5), array, stream)
    _sync(backend, stream)
    if contract.array_type == "cupy":
        with pytest.raises(TypeError):
            np.asarray(array)  # CuPy refuses implicit conversion to numpy
        with pytest.raises(TypeError):
            array + np.ones((4, 5))  # and mixing with numpy arrays
        doubled = 2 * array[1:3] + 1
        assert type(doubled) is type(array) and doubled.shape == (2, 5)
        assert np.array_equal(doubled.get(), 2 * np.arange(5.0, 15.0).reshape(2, 5) + 1)
        assert float(array.sum()) == 190.0 and float(array[3, 4]) == 19.0
        with pytest.raises(ValueError):
            array[0] = np.arange(5.0)  # CuPy refuses numpy arrays in assignment...
        array[0].set(np.arange(5.0) * 10)  # ...and copies them in through .set()
        array[1] = 7.0
        assert np.array_equal(array[0].get(), np.arange(5.0) * 10) and float(array[1, 2]) == 7.0
        assert array.flags.c_contiguous and not array[:, 1:].flags.c_contiguous
    else:
        with pytest.raises(TypeError):
            array + 1  # numba device arrays have no arithmetic
        with pytest.raises(TypeError):
            array * 2.0
        host = array.copy_to_host()
        assert isinstance(host, np.ndarray) and np.array_equal(host, np.arange(20.0).reshape(4, 5))
        assert np.array_equal(array[1:3].copy_to_host(), host[1:3])
        assert float(array[3, 4]) == 19.0
        assert array.is_c_contiguous() and array.flags["C_CONTIGUOUS"]
