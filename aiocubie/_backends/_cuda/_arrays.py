"""Arrays over blocks: CuPy arrays for device-side kinds, numpy arrays for host kinds; array addresses.

It allocates nothing (the resources do) and copies nothing (the device does). It never imports
numba: numba arrays are ``aiocubie._backends._numba``'s, and any CUDA-array-interface object is
read through that interface.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..._errors import BackendError, ConfigurationError
from ..._names import MemoryKind
from .._arrays import ArrayMaker
from .._resource import Block
from ._streams import import_cupy

__all__ = [
    "CupyArrays",
    "c_strides",
    "device_pointer",
    "host_address",
    "host_array",
    "pointer_and_contiguity",
    "pointer_and_strides",
]

_HOST_KINDS = (MemoryKind.HOST, MemoryKind.PINNED)


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def host_array(block: Block, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A numpy array of ``shape`` over host ``block`` that keeps the block's memory alive."""
    handle = block.handle
    if isinstance(handle, np.ndarray):  # pageable host memory is numpy's own
        return np.ndarray(shape, dtype, buffer=handle)
    if not block.nbytes:
        return np.empty(shape, dtype)
    raw = (ctypes.c_uint8 * block.nbytes).from_address(block.ptr)
    raw._aiocubie_owner = handle  # type: ignore[attr-defined]  # numpy holds raw, raw holds the memory
    return np.ndarray(shape, dtype, buffer=raw)  # type: ignore[arg-type]  # ctypes arrays are buffers


class CupyArrays(ArrayMaker):
    """``cupy.ndarray`` over device-side blocks; numpy arrays over host ones.

    Parameters
    ----------
    device_id : int
        The device the blocks live on (CuPy records it on each array).

    Raises
    ------
    ConfigurationError
        If CuPy is not importable (the message names the extra to install).
    """

    name = "cupy"

    def __init__(self, device_id: int) -> None:
        self._cupy = cupy = import_cupy(ConfigurationError)
        self._device_id = device_id
        self._ndarray = cupy.ndarray
        self._pointer_type = cupy.cuda.MemoryPointer
        self._unowned = cupy.cuda.UnownedMemory

    def make(self, block: Block, shape: tuple[int, ...], dtype: np.dtype[Any], stream: Any) -> Any:
        if block.kind in _HOST_KINDS:
            return host_array(block, shape, dtype)
        handle = block.handle
        if type(handle) is self._pointer_type:  # a CuPy pool's block: the array goes straight over it
            return self._ndarray(shape, dtype, memptr=handle)
        if not block.nbytes:
            return self._ndarray(shape, dtype)
        memory = self._unowned(block.ptr, block.nbytes, handle, self._device_id)
        return self._ndarray(shape, dtype, memptr=self._pointer_type(memory, 0))


def device_pointer(array: Any) -> int | None:
    """The device address of a CuPy array or any CUDA-array-interface object; None for numpy arrays."""
    if isinstance(array, np.ndarray):
        return None
    data = getattr(array, "data", None)
    ptr = getattr(data, "ptr", None)  # cupy.ndarray.data is a MemoryPointer
    if isinstance(ptr, int):
        return ptr
    interface = getattr(array, "__cuda_array_interface__", None)
    return None if interface is None else int(interface["data"][0])


def host_address(array: np.ndarray[Any, Any]) -> int:
    """The address of a numpy array's first element (``array.ctypes.data`` without the two ctypes
    helper objects numpy builds in Python for it: this runs for every copy of a walk)."""
    address: int = array.__array_interface__["data"][0]
    return address


def pointer_and_contiguity(array: Any) -> tuple[int, bool]:
    """The address of any array (a host address for numpy, valid under unified addressing) and
    whether it is C-contiguous."""
    if isinstance(array, np.ndarray):
        return host_address(array), bool(array.flags.c_contiguous)
    flags = getattr(array, "flags", None)
    data = getattr(array, "data", None)
    ptr = getattr(data, "ptr", None)
    if isinstance(ptr, int) and flags is not None:  # CuPy: no interface dict to build
        return ptr, bool(flags.c_contiguous)
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        raise BackendError(f"cannot copy a {type(array).__name__}: not an array this backend knows")
    strides = interface.get("strides")
    if strides is None:
        return int(interface["data"][0]), True
    itemsize = np.dtype(interface["typestr"]).itemsize
    return int(interface["data"][0]), tuple(strides) == c_strides(tuple(interface["shape"]), itemsize)


def pointer_and_strides(array: Any) -> tuple[int, tuple[int, ...]]:
    """The address of any array's first element (a host address for numpy) and its byte strides."""
    if isinstance(array, np.ndarray):
        return host_address(array), tuple(array.strides)
    data = getattr(array, "data", None)
    ptr = getattr(data, "ptr", None)
    strides = getattr(array, "strides", None)
    if isinstance(ptr, int) and strides is not None:  # CuPy: no interface dict to build
        return ptr, tuple(strides)
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        raise BackendError(f"cannot copy a {type(array).__name__}: not an array this backend knows")
    shape = tuple(interface["shape"])
    found = interface.get("strides")
    return int(interface["data"][0]), tuple(found) if found is not None else c_strides(
        shape, np.dtype(interface["typestr"]).itemsize
    )
