"""Arrays built straight over a block: CuPy arrays, or numba device arrays in one constructor.

The only place that constructs numba's ``DeviceNDArray`` (:func:`numba_array`), so that
following numba-cuda's deprecation of its host-side array API is a change here alone. It
allocates nothing (``_pools`` does) and never calls ``cuda.device_array`` or its relatives.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
from numba.cuda.cudadrv import driver as nbdriver
from numba.cuda.cudadrv.devicearray import DeviceNDArray, DeviceNDArrayBase

from ..._errors import BackendError
from ._pools import Block

__all__ = ["cupy_array", "device_pointer", "numba_array", "pointer_and_contiguity"]


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def numba_array(shape: tuple[int, ...], dtype: np.dtype[Any], block: Block | None, stream: Any, context: Any) -> Any:
    """A C-contiguous numba ``DeviceNDArray`` over ``block`` (None: an empty array), on ``stream``."""
    if block is None:
        gpu_data = None  # numba makes its own NULL pointer for an empty array
    elif isinstance(block.owner, nbdriver.MemoryPointer):
        gpu_data = block.owner
    else:  # a CuPy pool block: numba's pointer holds it until the array goes
        gpu_data = nbdriver.MemoryPointer(context, ctypes.c_void_p(block.ptr), block.size, owner=block.owner)
    return DeviceNDArray(shape, _c_strides(shape, dtype.itemsize), dtype, stream=stream, gpu_data=gpu_data)


def cupy_array(cupy: Any, shape: tuple[int, ...], dtype: np.dtype[Any], block: Block | None, device_id: int) -> Any:
    """A C-contiguous ``cupy.ndarray`` over ``block`` (None: an empty array)."""
    if block is None:
        return cupy.ndarray(shape, dtype)
    if isinstance(block.owner, cupy.cuda.MemoryPointer):
        return cupy.ndarray(shape, dtype, memptr=block.owner)
    memory = cupy.cuda.UnownedMemory(block.ptr, block.size, block.owner, device_id)
    return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))


def device_pointer(array: Any) -> int | None:
    """The device address of a CuPy or numba array (or any CUDA-array-interface object); None for host arrays."""
    if isinstance(array, np.ndarray):
        return None
    if isinstance(array, DeviceNDArrayBase):
        return int(array.device_ctypes_pointer.value or 0)
    data = getattr(array, "data", None)
    ptr = getattr(data, "ptr", None)  # cupy.ndarray.data is a MemoryPointer
    if isinstance(ptr, int):
        return ptr
    interface = getattr(array, "__cuda_array_interface__", None)
    return None if interface is None else int(interface["data"][0])


def pointer_and_contiguity(array: Any) -> tuple[int, bool]:
    """The address of any array (a host pointer for numpy, valid under unified addressing) and
    whether it is C-contiguous."""
    if isinstance(array, np.ndarray):
        return int(array.ctypes.data), bool(array.flags.c_contiguous)
    if isinstance(array, DeviceNDArrayBase):
        return int(array.device_ctypes_pointer.value or 0), bool(array.is_c_contiguous())
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        raise BackendError(f"cannot copy a {type(array).__name__}: not an array this backend knows")
    strides = interface.get("strides")
    if strides is None:
        return int(interface["data"][0]), True
    itemsize = np.dtype(interface["typestr"]).itemsize
    return int(interface["data"][0]), tuple(strides) == _c_strides(tuple(interface["shape"]), itemsize)
