"""Backends: three small protocols and their implementations; the only layer that imports CUDA libraries.

``_device`` (:class:`Device`, :class:`Event`), ``_resource`` (:class:`MemoryResource`, :class:`Block`,
adaptors), ``_arrays`` (:class:`ArrayMaker`), bundled as a :class:`Backend` (``_base``) and picked
in ``_select``. The simulator is ``_sim``; the GPU is ``_cuda`` (cuda.core, CuPy) and ``_numba``
(the numba extra). Only ``_cuda`` imports cuda.core, cuda.bindings or CuPy; only ``_numba`` (and
the simulator's numba model) imports numba.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .._stats import PoolFacts
from ._arrays import ARRAY_TYPES, ArrayMaker, parse_array_type
from ._base import Backend
from ._device import ALLOCATORS, Advice, Copier, Device, Event, MemoryInfo
from ._pinned import PinnedPool
from ._resource import Block, FailureHandler, LibraryPool, MemoryResource, ResourceAdaptor
from ._select import BACKENDS, create_backend, device_count, gpu_status, select_backend
from ._sim import Engines, Faults, SimDevice, SimStream, SimulatorBackend, TimelineEntry
from ._staging import Staging, stage
from ._stream import StreamLike
from ._strided import Geometry, geometry

__all__ = [
    "ALLOCATORS",
    "ARRAY_TYPES",
    "BACKENDS",
    "Advice",
    "ArrayMaker",
    "Backend",
    "Block",
    "Copier",
    "Device",
    "Engines",
    "Event",
    "FailureHandler",
    "Faults",
    "Geometry",
    "LibraryPool",
    "MemoryInfo",
    "MemoryResource",
    "PinnedPool",
    "PoolFacts",
    "ResourceAdaptor",
    "SimDevice",
    "SimulatorBackend",
    "Staging",
    "StreamLike",
    "TimelineEntry",
    "create_backend",
    "current_cupy_stream",
    "device_count",
    "geometry",
    "gpu_status",
    "parse_array_type",
    "select_backend",
    "stage",
]


def current_cupy_stream(stream: Any) -> AbstractContextManager[Any]:
    """A context manager that makes ``stream`` CuPy's current stream (seed 001).

    CuPy work inside the block (kernels, copies, ``MemoryAsyncPool`` allocations) is then
    ordered on the group's stream. Needs CuPy (extras ``cuda12`` or ``cuda13``) on a GPU; on
    the simulator it binds nothing (its arrays' work is ordered by waiting for their stream).
    """
    if isinstance(stream, SimStream):
        return contextlib.nullcontext(stream)
    bind = _bind.get("cuda")
    if bind is None:
        from ._cuda import current_cupy_stream as cuda_bind

        bind = _bind["cuda"] = cuda_bind
    return bind(stream)


#: The CUDA backend's current_cupy_stream, once imported (an import statement costs a microsecond a launch).
_bind: dict[str, Callable[[Any], AbstractContextManager[Any]]] = {}
