"""aiocubie: an async GPU memory allocation service. Components register with a :class:`MemoryManager`
and ``await mgr.request(...)`` their arrays; a stream group's requests are batched, planned to fit the
budget, allocated on its stream and resolved when the device is done. Namespaces: ``aiocubie.errors``,
``aiocubie.mr`` (memory resources), ``aiocubie.planning``, ``aiocubie.simulator``, ``aiocubie.stats``;
``aiocubie.cubie``, ``aiocubie.dask`` and ``aiocubie.testing`` behind their extras.
"""

from . import errors, mr, planning, simulator, stats
from ._backends import Backend, Event, create_backend, current_cupy_stream, device_count, gpu_status, select_backend
from ._budget import LimitMode
from ._devices import DeviceSet
from ._grouping import GroupsView
from ._limits import BudgetView
from ._manager import MemoryManager, PendingRequest, default_manager
from ._options import Options, Policy
from ._pool import PoolView
from ._requests import ArrayRequest, ArrayResponse, MemoryKind
from ._transfers import HostView
from ._version import __version__ as __version__
from ._walks import Chunk, walk_batches, walk_chunks, walk_requests

# fmt: off
__all__ = [
    "ArrayRequest", "ArrayResponse", "Backend", "BudgetView", "Chunk", "DeviceSet", "Event", "GroupsView",
    "HostView", "LimitMode", "MemoryKind", "MemoryManager", "Options", "PendingRequest", "Policy", "PoolView",
    "create_backend", "current_cupy_stream", "default_manager", "device_count", "gpu_status", "select_backend",
    "walk_batches", "walk_chunks", "walk_requests",
]
# fmt: on
