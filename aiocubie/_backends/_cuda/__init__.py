"""The CUDA backend, one concept a module: ``_pools`` (where blocks come from), ``_arrays``
(arrays built over them), ``_events``, ``_streams``, ``_errors`` (the one error map) and
``_backend`` (the :class:`CudaBackend` that ties them together).

Importing it imports numba.cuda (not CuPy); only ``aiocubie._backends`` imports it.
"""

from __future__ import annotations

from ._backend import CudaBackend, cuda_usable
from ._events import EVENT_MECHANISMS, CudaEvent
from ._pools import CupyAsyncPoolManager, CupyPoolManager
from ._streams import current_cupy_stream, stream_ptr

# The names the GPU tests and benchmarks of 0.1.0 use.
_CupyPoolManager = CupyPoolManager
_CupyAsyncPoolManager = CupyAsyncPoolManager
_stream_ptr = stream_ptr

__all__ = [
    "EVENT_MECHANISMS",
    "CudaBackend",
    "CudaEvent",
    "CupyAsyncPoolManager",
    "CupyPoolManager",
    "cuda_usable",
    "current_cupy_stream",
]
