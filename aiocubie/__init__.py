"""aiocubie: an async GPU memory allocation service.

Components register with a :class:`MemoryManager` and ``await mgr.request(...)`` the arrays
they need; requests of a stream group are batched, chunk-planned to fit the memory budget,
allocated on the group's stream, and resolved when the device is done.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ._backends import (
    Backend,
    Event,
    create_backend,
    current_cupy_stream,
    device_count,
    gpu_status,
    select_backend,
)
from ._budget import LimitMode
from ._devices import DeviceSet
from ._grouping import GroupsView
from ._limits import BudgetView
from ._manager import MemoryManager, PendingRequest, default_manager
from ._options import Options, Policy
from ._pool import PoolView
from ._requests import ArrayRequest, ArrayResponse, MemoryKind
from ._transfers import HostView
from ._walk import Chunk, walk_batches, walk_chunks, walk_requests

__version__ = "0.2.0.dev0"

__all__ = [
    "ArrayRequest",
    "ArrayResponse",
    "Backend",
    "BudgetView",
    "Chunk",
    "DeviceSet",
    "Event",
    "GroupsView",
    "HostView",
    "LimitMode",
    "MemoryKind",
    "MemoryManager",
    "Options",
    "PendingRequest",
    "Policy",
    "PoolView",
    "create_backend",
    "current_cupy_stream",
    "default_manager",
    "device_count",
    "gpu_status",
    "select_backend",
    "walk_batches",
    "walk_chunks",
    "walk_requests",
]

#: The sub-namespaces, imported on first use (``aiocubie.errors.BudgetError`` after ``import aiocubie``).
_NAMESPACES = frozenset({"cubie", "dask", "errors", "mr", "planning", "simulator", "stats", "testing"})


def __getattr__(name: str) -> ModuleType:
    if name in _NAMESPACES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
