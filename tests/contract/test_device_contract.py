"""The device contract: what every Device promises (streams, events, copies, fills, memory, managed memory).

Runs on every case of ``contractkit.CASES``: the simulator's resources and array types here, and
every CUDA resource on a GPU. Arrays come from the case's resource and array maker, as the device
account makes them.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from contractkit import DEVICE_SIDE, HOST_SIDE, RESOURCES, Contract, to_numpy

from aiocubie import MemoryKind, mr
from aiocubie._backends import Device, StreamLike
from aiocubie.errors import BackendError, InvalidRequestError, UnknownAllocatorError

rng = np.random.default_rng()


def test_protocol_attributes(contract: Contract) -> None:
    device = contract.device
    assert isinstance(device, Device) and contract.backend.name == device.name in ("simulator", "cuda")
    assert device.device_name and device.device_id == 0 and device.granule >= 0
    assert set(device.resources) <= set(RESOURCES) and device.default_resource in device.resources
    assert contract.resource.name == contract.resource_name in device.resources
    assert contract.backend.array_type == contract.array_type
    info = device.memory_info()
    assert 0 < info.free <= info.total
    stream = device.create_stream()
    assert isinstance(stream, StreamLike) and isinstance(stream.__cuda_stream__(), tuple)
    with device.activate():  # cheap, and nestable
        with device.activate():
            contract.sync(stream)


def test_create_resource_names(contract: Contract) -> None:
    device = contract.device
    for name in ("nope", None, 3):
        with pytest.raises(UnknownAllocatorError, match="use one of"):
            device.create_resource(name)  # type: ignore[arg-type]
    assert device.create_resource("default").name == device.default_resource
    assert all(name in mr.allocator_names() for name in device.resources)


@pytest.mark.parametrize("kind", list(MemoryKind), ids=lambda k: k.value)
def test_zero_every_kind(contract: Contract, kind: MemoryKind) -> None:
    device = contract.device
    stream = device.create_stream()
    array = contract.alloc((3, 1000), np.float64, kind, stream)
    device.copy(np.full((3, 1000), np.nan), array, stream)  # so that zero() must really write
    device.zero(array, stream)
    contract.sync(stream)
    assert np.array_equal(to_numpy(array), np.zeros((3, 1000)))
    contract.free(array)


@pytest.mark.parametrize("host_kind", HOST_SIDE, ids=lambda k: k.value)
@pytest.mark.parametrize("device_kind", DEVICE_SIDE, ids=lambda k: k.value)
def test_copies_round_trip_every_kind(contract: Contract, device_kind: MemoryKind, host_kind: MemoryKind) -> None:
    device = contract.device
    stream = device.create_stream()
    shape, dtype = (500, 37), np.dtype(np.float64)
    src = device.host_array(shape, dtype, host_kind)
    src[...] = rng.standard_normal(shape)
    dev = contract.alloc(shape, dtype, device_kind, stream)
    other = contract.alloc(shape, dtype, device_kind, stream)
    dst = device.host_array(shape, dtype, host_kind)
    dst[...] = np.nan
    device.copy(src, dev, stream)
    device.copy(dev, other, stream)  # device to device
    device.copy(other, dst, stream)
    contract.sync(stream)
    assert np.array_equal(dst, src)
    assert np.array_equal(to_numpy(dev), src)
    contract.free(dev)
    contract.free(other)


def test_copy_rejects_mismatches(contract: Contract) -> None:
    device = contract.device
    stream = device.create_stream()
    dev = contract.alloc((10,), np.float32, MemoryKind.DEVICE, stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        device.copy(np.zeros(11, np.float32), dev, stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        device.copy(dev, np.zeros(10, np.float64), stream)
    with pytest.raises(BackendError, match="contiguous"):
        device.copy(np.zeros(20, np.float32)[::2], dev, stream)
    grid = contract.alloc((4, 6), np.float32, MemoryKind.DEVICE, stream)
    with pytest.raises(BackendError, match="contiguous"):
        device.copy(grid[:, :3], np.zeros((4, 3), np.float32), stream)
    contract.sync(stream)
    contract.free(dev)
    contract.free(grid)


def test_event_callbacks_and_queries(contract: Contract) -> None:
    device = contract.device
    stream = device.create_stream()
    array = contract.alloc((1 << 16,), np.float64, MemoryKind.DEVICE, stream)
    device.zero(array, stream)
    event = device.record_event(stream)
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
    contract.free(array)


def test_a_stream_waits_for_another_streams_event(contract: Contract) -> None:
    # copy in on one stream, device-to-device on a second that waits for the first's event,
    # copy out on a third that waits for the second's: the data must arrive whole
    device = contract.device
    first, second, third = device.create_stream(), device.create_stream(), device.create_stream()
    shape, dtype = (1 << 20,), np.dtype(np.float32)
    src = device.host_array(shape, dtype, MemoryKind.PINNED)
    src[...] = rng.standard_normal(shape)
    a = contract.alloc(shape, dtype, MemoryKind.DEVICE, first)
    b = contract.alloc(shape, dtype, MemoryKind.DEVICE, first)
    contract.sync(first)
    dst = device.host_array(shape, dtype, MemoryKind.PINNED)
    device.copy(src, a, first)
    device.wait_event(second, device.record_event(first))
    device.copy(a, b, second)
    device.wait_event(third, device.record_event(second))
    device.copy(b, dst, third)
    contract.sync(third)
    assert np.array_equal(dst, src)
    device.wait_event(third, device.record_event(third))  # an event already reached: no wait
    contract.free(a)
    contract.free(b)


def test_pinned_host_memory_is_known(contract: Contract) -> None:
    device = contract.device
    pinned = device.host_array((64, 3), np.dtype(np.float64), MemoryKind.PINNED)
    assert device.is_pinned(pinned) and device.is_pinned(pinned[5:9])
    assert not device.is_pinned(device.host_array((64, 3), np.dtype(np.float64), MemoryKind.HOST))
    assert not device.is_pinned(np.zeros(10))
    stream = device.create_stream()
    block_pinned = contract.alloc((16,), np.float32, MemoryKind.PINNED, stream)  # the resource's pinned blocks too
    assert isinstance(block_pinned, np.ndarray) and device.is_pinned(block_pinned)
    contract.free(block_pinned)
    pool = device.pinned_pool
    buffer = pool.acquire(1000)
    assert buffer.nbytes >= 1000 and device.is_pinned(buffer)
    pool.release(buffer)
    assert pool.acquire(900) is buffer  # reused, not pinned again
    pool.release(buffer)


def test_host_array(contract: Contract) -> None:
    device = contract.device
    for kind in HOST_SIDE:
        array = device.host_array((3, 5), np.dtype(np.int64), kind)
        assert isinstance(array, np.ndarray) and array.shape == (3, 5) and not array.any()
    for kind in DEVICE_SIDE:
        with pytest.raises(InvalidRequestError):
            device.host_array((3,), np.dtype(np.int64), kind)


def test_managed_prefetch_and_advice(contract: Contract) -> None:
    device = contract.device
    stream = device.create_stream()
    array = contract.alloc((1 << 16,), np.float32, MemoryKind.MANAGED, stream)
    expected = rng.standard_normal(1 << 16).astype(np.float32)
    device.copy(expected, array, stream)
    for advice in ("preferred_location", "accessed_by", "read_mostly"):
        device.advise(array, advice, 0)
    device.advise(array, "accessed_by", None)
    device.prefetch(array, 0, stream)
    device.prefetch(array, None, stream)
    contract.sync(stream)
    assert np.array_equal(to_numpy(array), expected)
    with pytest.raises(BackendError, match="advice"):
        device.advise(array, "nonsense", 0)  # type: ignore[arg-type]
    if contract.backend.name == "cuda":  # the simulator does not track which memory is managed
        plain = contract.alloc((4,), np.float32, MemoryKind.DEVICE, stream)
        with pytest.raises(BackendError, match="managed"):
            device.prefetch(plain, 0, stream)
        contract.free(plain)
    contract.free(array)


# -- strided copies (issue 21): a chunk's slice of a host array, to and from a trimmed chunk buffer --

#: (full host shape, run axis): the run axis first, in the middle, last; 2-D and 3-D
LAYOUTS = [((13, 6), 0), ((6, 13), 1), ((13, 4, 5), 0), ((4, 13, 5), 1), ((4, 5, 13), 2)]


def _chunk(shape: tuple[int, ...], axis: int, start: int, stop: int) -> tuple[slice, ...]:
    return (slice(None),) * axis + (slice(start, stop),)


@pytest.mark.parametrize("host_kind", HOST_SIDE, ids=lambda k: k.value)
@pytest.mark.parametrize("device_kind", DEVICE_SIDE, ids=lambda k: k.value)
@pytest.mark.parametrize(("shape", "axis"), LAYOUTS, ids=lambda v: str(v))
def test_strided_chunks_round_trip(
    contract: Contract, device_kind: MemoryKind, host_kind: MemoryKind, shape: tuple[int, ...], axis: int
) -> None:
    # every chunk of 5 runs (the last one 3) goes host slice -> buffer of 5 trimmed -> another
    # buffer -> host slice of another array, each copy strided on both sides where the layout is
    device = contract.device
    stream = device.create_stream()
    dtype = np.dtype(np.float32)
    src = device.host_array(shape, dtype, host_kind)
    src[...] = rng.standard_normal(shape)
    dst = device.host_array(shape, dtype, host_kind)
    dst[...] = np.nan
    length = 5
    buffer_shape = tuple(length if a == axis else n for a, n in enumerate(shape))
    first = contract.alloc(buffer_shape, dtype, device_kind, stream)
    second = contract.alloc(buffer_shape, dtype, device_kind, stream)
    for start in range(0, shape[axis], length):
        stop = min(start + length, shape[axis])
        part = _chunk(shape, axis, start, stop)
        trimmed = _chunk(shape, axis, 0, stop - start)
        device.copy_strided(src[part], first[trimmed], stream, tag=("in", start))
        device.copy_strided(first[trimmed], second[trimmed], stream)  # device to device
        device.copy_strided(second[trimmed], dst[part], stream, tag=("out", start))
        contract.sync(stream)  # the buffers are reused by the next chunk
    assert dst.tobytes() == src.tobytes()
    contract.free(first)
    contract.free(second)


@pytest.mark.parametrize("host_kind", HOST_SIDE, ids=lambda k: k.value)
def test_strided_copies_of_three_levels_and_transposed_views(contract: Contract, host_kind: MemoryKind) -> None:
    device = contract.device
    stream = device.create_stream()
    dtype = np.dtype(np.int32)
    host = device.host_array((6, 7, 8), dtype, host_kind)
    host[...] = np.arange(host.size, dtype=dtype).reshape(host.shape)
    dev = contract.alloc((6, 7, 8), dtype, MemoryKind.DEVICE, stream)
    device.zero(dev, stream)
    view = (slice(1, 5), slice(2, 6), slice(1, 7))  # a 3-D copy: slices whole rows apart on both sides
    device.copy_strided(host[view], dev[view], stream)
    back = device.host_array((4, 4, 6), dtype, host_kind)
    device.copy_strided(dev[view], back, stream)
    expected = np.zeros((6, 7, 8), dtype)
    expected[view] = host[view]
    contract.sync(stream)
    assert back.tobytes() == host[view].tobytes()
    assert to_numpy(dev).tobytes() == expected.tobytes()
    # a transposed host view (rows of one slice interleave with the next's): a 2-D copy a slice
    transposed = host.transpose(1, 0, 2)
    square = contract.alloc((7, 6, 8), dtype, MemoryKind.DEVICE, stream)
    device.copy_strided(transposed, square, stream)
    contract.sync(stream)
    assert to_numpy(square).tobytes() == np.ascontiguousarray(transposed).tobytes()
    contract.free(dev)
    contract.free(square)


def test_strided_copies_refuse_what_the_copy_engines_cannot_do(contract: Contract) -> None:
    device = contract.device
    stream = device.create_stream()
    dev = contract.alloc((4, 6), np.float32, MemoryKind.DEVICE, stream)
    host = np.zeros((4, 6), np.float32)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        device.copy_strided(host[:, :3], dev[:, :4], stream)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        device.copy_strided(host.astype(np.float64), dev, stream)
    with pytest.raises(BackendError, match="reversed, broadcast"):
        device.copy_strided(host[::-1], dev, stream)
    with pytest.raises(BackendError, match="reversed, broadcast"):
        device.copy_strided(np.broadcast_to(np.zeros(6, np.float32), (4, 6)), dev, stream)
    with pytest.raises(BackendError, match="overlap"):
        device.copy_strided(dev[:, :4], dev[:, 2:], stream)  # a GPU would read what it writes
    with pytest.raises(BackendError, match="overlap"):
        device.copy_strided(host[1:3], host[2:4], stream)
    # slices 3 bytes apart, rows of 4 bytes: the target's elements overlap (its slices' rows interleave
    # within a pitch, but are not clear of each other); a copy into it depends on the engines' order
    bytes_ = np.zeros(32, np.uint8)
    overlapping = np.lib.stride_tricks.as_strided(bytes_, shape=(2, 2, 4), strides=(3, 12, 1))
    with pytest.raises(BackendError, match="reversed, broadcast or overlapping"):
        device.copy_strided(np.ones((2, 2, 4), np.uint8), overlapping, stream)
    device.copy_strided(dev[:2], dev[2:], stream)  # two halves of one buffer: apart, fine
    device.copy_strided(host[:0], dev[:0], stream)  # nothing to copy
    contract.sync(stream)
    contract.free(dev)


def test_the_simulator_refuses_a_strided_copy_outside_its_memory(contract: Contract) -> None:
    if contract.backend.name != "simulator":
        pytest.skip("on a GPU this would corrupt memory: the simulator is where it must fail")
    device = contract.device
    stream = device.create_stream()
    dev = contract.alloc((4, 6), np.float32, MemoryKind.DEVICE, stream)
    host = np.zeros(24, np.float32)
    past = np.lib.stride_tricks.as_strided(host[12:], shape=(4, 6), strides=(24, 4))  # 12 floats too far
    with pytest.raises(BackendError, match="outside its"):
        device.copy_strided(past, dev, stream)
    with pytest.raises(BackendError, match="outside its"):
        device.copy_strided(dev, past, stream)
    contract.sync(stream)
    contract.free(dev)


# -- bound copies (issue 21): a batch stream's copies into and out of one array, bound once --
@pytest.mark.parametrize("host_kind", HOST_SIDE, ids=lambda k: k.value)
@pytest.mark.parametrize("device_kind", DEVICE_SIDE, ids=lambda k: k.value)
def test_bound_copies_move_batch_after_batch(
    contract: Contract, device_kind: MemoryKind, host_kind: MemoryKind
) -> None:
    device = contract.device
    stream = device.create_stream()
    shape, dtype = (40, 33), np.dtype(np.float32)
    dev = contract.alloc(shape, dtype, device_kind, stream)
    into, out_of = device.copier(dev, stream, to_device=True), device.copier(dev, stream, to_device=False)
    sources = [device.host_array(shape, dtype, host_kind) for _ in range(3)]
    targets = [device.host_array(shape, dtype, host_kind) for _ in range(3)]
    for b, (src, dst) in enumerate(zip(sources, targets)):
        src[...] = rng.standard_normal(shape)
        dst[...] = np.nan
        into(src, ("in", b))
        out_of(dst, ("out", b))  # stream order: after this batch's copy in, before the next one's
    wide = device.host_array((40, 66), dtype, host_kind)  # a strided view goes as copy_strided would take it
    wide[...] = rng.standard_normal(wide.shape)
    into(wide[:, :33])
    back = device.host_array(shape, dtype, host_kind)
    out_of(back)
    contract.sync(stream)
    for src, dst in zip(sources, targets):
        assert np.array_equal(dst, src)
    assert np.array_equal(back, wide[:, :33])
    contract.free(dev)


def test_bound_copies_refuse_what_copy_strided_refuses(contract: Contract) -> None:
    device = contract.device
    stream = device.create_stream()
    dev = contract.alloc((4, 6), np.float32, MemoryKind.DEVICE, stream)
    into, out_of = device.copier(dev, stream, to_device=True), device.copier(dev, stream, to_device=False)
    with pytest.raises(BackendError, match="shapes and dtypes"):
        into(np.zeros((4, 5), np.float32))
    with pytest.raises(BackendError, match="shapes and dtypes"):
        out_of(np.zeros((4, 6), np.float64))
    with pytest.raises(BackendError, match="reversed, broadcast"):
        into(np.zeros((4, 6), np.float32)[::-1])
    into(np.ones((4, 6), np.float32))  # and a good one still goes
    back = np.zeros((4, 6), np.float32)
    out_of(back)
    contract.sync(stream)
    assert np.array_equal(back, np.ones((4, 6), np.float32))
    contract.free(dev)


@pytest.mark.parametrize("device_kind", DEVICE_SIDE, ids=lambda k: k.value)
def test_bound_copies_say_what_goes_straight(contract: Contract, device_kind: MemoryKind) -> None:
    device = contract.device
    stream = device.create_stream()
    shape, dtype = (16, 9), np.dtype(np.float64)
    dev = contract.alloc(shape, dtype, device_kind, stream)
    into, out_of = device.copier(dev, stream, to_device=True), device.copier(dev, stream, to_device=False)
    pinned = device.host_array(shape, dtype, MemoryKind.PINNED)
    wide = device.host_array((16, 18), dtype, MemoryKind.PINNED)
    read_only = device.host_array(shape, dtype, MemoryKind.PINNED)
    read_only.flags.writeable = False
    pageable = device.host_array(shape, dtype, MemoryKind.HOST)
    for host in (
        pageable,
        wide[:, :9],
        wide.reshape(-1)[:144].reshape(16, 9).astype(np.float32),
        wide[:8],
        [[0.0] * 9] * 16,
    ):
        assert into.straight(host) is None and out_of.straight(host) is None
    assert into.straight(read_only) is not None and out_of.straight(read_only) is None  # read from, not written
    pinned[...] = rng.standard_normal(shape)
    into.queue(into.straight(pinned), ("in", 0))
    back = device.host_array(shape, dtype, MemoryKind.PINNED)
    back[...] = np.nan
    out_of.queue(out_of.straight(back), ("out", 0))
    contract.sync(stream)
    assert np.array_equal(back, pinned)
    contract.free(dev)
