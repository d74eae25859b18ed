"""The resource and array-maker contract: blocks of every kind, pools, out of memory, arrays over blocks.

Runs on every case of ``contractkit.CASES``: each simulator resource here, each CUDA resource on a
GPU. It checks what the device account relies on: a block per allocation of exactly the bytes
asked, an array that keeps its block's memory alive after the block is given back, out-of-memory
as :class:`OutOfMemoryError` (what recovery acts on), and pool facts that add up.
"""

from __future__ import annotations

import numpy as np
import pytest
from contractkit import HOST_SIDE, Contract, to_numpy

from aiocubie import MemoryKind, create_backend
from aiocubie._backends import ArrayMaker, Block, MemoryResource, parse_array_type
from aiocubie._backends._sim import SimDevice
from aiocubie.errors import AllocationError, BackendError, ConfigurationError, OutOfMemoryError, ReleasedError


def test_the_bundle(contract: Contract) -> None:
    backend = contract.backend
    assert isinstance(backend.resource, MemoryResource) and isinstance(backend.arrays, ArrayMaker)
    assert backend.arrays.name == contract.array_type and contract.resource_name in repr(backend)


@pytest.mark.parametrize("kind", list(MemoryKind), ids=lambda k: k.value)
def test_allocate_every_kind(contract: Contract, kind: MemoryKind) -> None:
    stream = contract.device.create_stream()
    array = contract.alloc((4, 100), np.float32, kind, stream)
    block = contract.block_of(array)
    assert isinstance(block, Block) and block.nbytes == 1600 and block.kind is kind and block.ptr != 0
    assert array.shape == (4, 100) and array.dtype == np.float32
    assert contract.backend.arrays.nbytes(array) == 1600
    if kind in HOST_SIDE:
        assert isinstance(array, np.ndarray) and array.flags.c_contiguous
    elif contract.array_type == "cupy":
        assert hasattr(array, "get") and not hasattr(array, "copy_to_host")
    else:
        assert hasattr(array, "copy_to_host") and not hasattr(array, "get")
    empty = contract.alloc((0, 3), np.float64, kind, stream)
    assert empty.shape == (0, 3) and contract.block_of(empty).nbytes == 0
    contract.free(array)
    contract.free(empty)


@pytest.mark.parametrize("kind", [MemoryKind.DEVICE, MemoryKind.MANAGED, MemoryKind.MAPPED], ids=lambda k: k.value)
def test_cuda_array_interface_v3_with_stream(contract: Contract, kind: MemoryKind) -> None:
    stream = contract.device.create_stream()
    array = contract.alloc((8, 4), np.int32, kind, stream)
    interface = array.__cuda_array_interface__
    assert interface["version"] == 3
    assert interface["shape"] == (8, 4) and np.dtype(interface["typestr"]) == np.int32
    assert interface["data"][0] != 0 and interface["data"][1] is False
    assert interface["strides"] is None  # C-contiguous
    # The stream the consumer must order its work after: a real stream, never 0 (v3 forbids it).
    assert "stream" in interface and interface["stream"] not in (0,)
    view = array[:, 1:3].__cuda_array_interface__
    assert view["strides"] == (16, 4) and view["data"][0] == interface["data"][0] + 4
    contract.free(array)


def test_an_array_keeps_its_memory_after_its_block_is_given_back(contract: Contract) -> None:
    # free(label) drops the account's references: an array the user still holds must not see
    # its memory handed to the next allocation (on a GPU that would corrupt it silently)
    device = contract.device
    stream = device.create_stream()
    kept = contract.alloc((1 << 16,), np.float32, MemoryKind.DEVICE, stream)
    device.copy(np.full(1 << 16, 7.0, np.float32), kept, stream)
    contract.sync(stream)
    contract.free(kept)
    for _ in range(4):
        other = contract.alloc((1 << 16,), np.float32, MemoryKind.DEVICE, stream)
        device.copy(np.full(1 << 16, -1.0, np.float32), other, stream)
        contract.sync(stream)
        contract.free(other)
        del other
    if isinstance(device, SimDevice):  # stronger: the simulator refuses the released array (issue 22)
        with pytest.raises(ReleasedError):
            to_numpy(kept)
    else:
        assert (to_numpy(kept) == 7.0).all()


def test_out_of_memory_is_what_recovery_acts_on(contract: Contract) -> None:
    resource, device = contract.resource, contract.device
    stream = device.create_stream()
    total = device.memory_info().total
    with pytest.raises(OutOfMemoryError):  # no room: the kind of failure the account recovers from
        resource.allocate(total + (1 << 30), MemoryKind.DEVICE, stream)
    with pytest.raises(AllocationError):  # never more managed memory than the device has free
        resource.allocate(total + (1 << 30), MemoryKind.MANAGED, stream)
    small = contract.alloc((1024,), np.uint8, MemoryKind.DEVICE, stream)  # still works
    assert contract.block_of(small).nbytes == 1024
    contract.free(small)


def test_pool_facts_and_releasing_cached_blocks(contract: Contract) -> None:
    resource, device = contract.resource, contract.device
    stream = device.create_stream()
    arrays = [contract.alloc((1 << 20,), np.uint8, MemoryKind.DEVICE, stream) for _ in range(4)]
    contract.sync(stream)
    using = resource.pool_facts()
    if using.in_use is not None:  # a resource that cannot say reports None
        assert using.held is not None and using.held >= using.in_use >= 4 << 20
    for array in arrays:
        contract.free(array)
    del arrays, array  # the last references: a GPU pool gets the blocks back now
    contract.sync(stream)
    cached = resource.pool_facts()
    assert resource.release_cached() >= 0
    after = resource.pool_facts()
    if cached.cached is not None and after.cached is not None:
        assert after.cached <= cached.cached
    assert after.largest_free is None or after.largest_free >= 0
    assert resource.release_cached() >= 0  # nothing left to release: no harm
    small = contract.alloc((1024,), np.uint8, MemoryKind.DEVICE, stream)  # still works
    contract.free(small)


def test_a_block_given_back_twice_is_refused_loudly_on_the_simulator(contract: Contract) -> None:
    if contract.backend.name != "simulator":
        pytest.skip("the simulator's check: on a GPU a second free is the corruption it guards against")
    stream = contract.device.create_stream()
    array = contract.alloc((10,), np.float64, MemoryKind.DEVICE, stream)
    block = contract.block_of(array)
    contract.free(array)
    with pytest.raises(BackendError, match="twice"):
        contract.resource.deallocate(block)


def test_unknown_array_types_are_clear_errors(contract: Contract) -> None:
    with pytest.raises(ConfigurationError, match=r"unknown array type 'torch'.*aiocubie\[cuda12\]"):
        parse_array_type("torch")
    with pytest.raises(ConfigurationError, match="unknown array type"):
        create_backend("simulator", array_type="jax")


def test_array_type_behaviour(contract: Contract) -> None:
    """What the GPU refuses, every backend refuses; what users call, every backend supports."""
    device = contract.device
    stream = device.create_stream()
    array = contract.alloc((4, 5), np.float64, MemoryKind.DEVICE, stream)
    device.copy(np.arange(20.0).reshape(4, 5), array, stream)
    contract.sync(stream)
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
    contract.free(array)
