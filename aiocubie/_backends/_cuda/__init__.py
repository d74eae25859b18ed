"""The CUDA backend on cuda.core, one concept a module: ``_device`` (:class:`CudaDevice`: streams,
events, copies, activation), ``_resources`` (where blocks come from: ``driver``, ``cupy``,
``cupy_async``), ``_rmm`` (the ``rmm`` resource of the rmm extra, imported only when asked for),
``_arrays`` (CuPy arrays over blocks), ``_events``, ``_streams`` and ``_errors`` (the one error map).

Importing it imports cuda.core and cuda.bindings, never CuPy (until asked for) and never numba;
only ``aiocubie._backends`` imports it.
"""

from __future__ import annotations

from typing import Any

from ..._errors import ConfigurationError
from .._allocators import Allocator, make_resource
from .._arrays import ArrayMaker, parse_array_type
from .._base import Backend
from ._arrays import CupyArrays
from ._device import DEFAULT_RESOURCE, CudaDevice, cuda_usable, driver_device_count
from ._events import CudaEvent
from ._resources import CudaResource, CupyAsyncResource, CupyResource, DriverResource
from ._streams import current_cupy_stream, stream_handle

__all__ = [
    "DEFAULT_RESOURCE",
    "CudaDevice",
    "CudaEvent",
    "CudaResource",
    "CupyArrays",
    "CupyAsyncResource",
    "CupyResource",
    "DriverResource",
    "create_arrays",
    "create_cuda_backend",
    "cuda_usable",
    "current_cupy_stream",
    "driver_device_count",
    "stream_handle",
]


def create_arrays(array_type: str | None, device: CudaDevice) -> ArrayMaker:
    """The array maker for ``array_type`` (None: ``"cupy"``) on ``device``.

    Raises
    ------
    ConfigurationError
        For an unknown array type, or one whose library is not importable (naming the extra).
    """
    name = parse_array_type(array_type)
    if name == "cupy":
        return CupyArrays(device.device_id)
    try:
        from .._numba import NumbaArrays
    except ImportError as exc:
        raise ConfigurationError(
            f"array type 'numba' needs numba-cuda, which is not importable ({exc}): pip install 'aiocubie[numba]', "
            "or use array_type='cupy'"
        ) from exc
    maker: Any = NumbaArrays(device)
    return maker  # type: ignore[no-any-return]


def create_cuda_backend(*, device: int = 0, allocator: Allocator = "default", array_type: str | None = None) -> Backend:
    """A GPU backend: a :class:`CudaDevice` on ``device``, its resource ``allocator``, ``array_type`` arrays.

    Raises
    ------
    ConfigurationError
        For a device the process does not see, or an array type whose library is missing.
    UnknownAllocatorError
        For an allocator this device cannot make here (the message names what to install).
    """
    cuda_device = CudaDevice(device)
    arrays = create_arrays(array_type, cuda_device)
    return Backend(cuda_device, make_resource(cuda_device, allocator), arrays)
