"""Backends: three small protocols and their implementations; the only layer that imports CUDA libraries.

``_device`` (:class:`Device`, :class:`Event`), ``_resource`` (:class:`MemoryResource`, :class:`Block`,
:class:`PoolFacts`, :class:`SharedPool`), ``_adaptors`` (statistics, limit, failure callback), ``_allocators``
(the registry of allocator names), ``_arrays`` (:class:`ArrayMaker`), bundled as a :class:`Backend` (``_base``) and picked
in ``_select``. The simulator is ``_sim``; the GPU is ``_cuda`` (cuda.core, CuPy) and ``_numba``
(the numba extra). Only ``_cuda`` imports cuda.core, cuda.bindings or CuPy; only ``_numba`` (and
the simulator's numba model) imports numba.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ._adaptors import FailureCallbackAdaptor, LimitingAdaptor, StatisticsAdaptor, limiting_adaptors
from ._allocators import (
    Allocator,
    ResourceFactory,
    allocator_names,
    allocator_or_resource,
    make_resource,
    parse_allocator,
    register_allocator,
)
from ._arrays import ARRAY_TYPES, ArrayMaker, parse_array_type
from ._base import Backend
from ._device import Advice, Copier, Device, Event, MemoryInfo
from ._pinned import PinnedPool
from ._resource import (
    Block,
    FailureHandler,
    LibraryPool,
    MemoryResource,
    PoolFacts,
    ResourceAdaptor,
    SharedPool,
    require_shared_pool,
    shared_pool,
)
from ._select import BACKENDS, create_backend, device_count, gpu_status, select_backend
from ._sim import Engines, Faults, SimDevice, SimStream, SimulatorBackend, TimelineEntry
from ._staging import Staging, stage
from ._stream import StreamLike
from ._strided import Geometry, geometry

__all__ = [
    "ARRAY_TYPES",
    "BACKENDS",
    "Advice",
    "Allocator",
    "ArrayMaker",
    "Backend",
    "Block",
    "Copier",
    "Device",
    "Engines",
    "Event",
    "FailureCallbackAdaptor",
    "FailureHandler",
    "Faults",
    "Geometry",
    "LibraryPool",
    "LimitingAdaptor",
    "MemoryInfo",
    "MemoryResource",
    "PinnedPool",
    "PoolFacts",
    "ResourceAdaptor",
    "ResourceFactory",
    "SharedPool",
    "SimDevice",
    "SimulatorBackend",
    "Staging",
    "StatisticsAdaptor",
    "StreamLike",
    "TimelineEntry",
    "allocator_names",
    "allocator_or_resource",
    "create_backend",
    "current_cupy_stream",
    "device_count",
    "geometry",
    "gpu_status",
    "limiting_adaptors",
    "make_resource",
    "parse_allocator",
    "parse_array_type",
    "register_allocator",
    "require_shared_pool",
    "select_backend",
    "shared_pool",
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
