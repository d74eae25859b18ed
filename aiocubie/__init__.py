"""aiocubie: an async GPU memory allocation service.

Components register with a :class:`MemoryManager` and ``await mgr.request(...)`` the arrays
they need; requests of a stream group are batched, chunk-planned to fit the memory budget,
allocated on the group's stream, and resolved when the device is done.
"""

from __future__ import annotations

from ._backends import (
    Backend,
    Engines,
    Event,
    Faults,
    MemoryInfo,
    SimulatorBackend,
    TimelineEntry,
    create_backend,
    current_cupy_stream,
    device_count,
    gpu_status,
    select_backend,
)
from ._budget import MIN_AUTO_POOL, LimitMode
from ._devices import DeviceSet
from ._errors import (
    AiocubieError,
    AiocubieWarning,
    AllocationError,
    BackendError,
    BudgetError,
    ConfigurationError,
    ContextResetError,
    InsufficientMemoryError,
    InvalidRequestError,
    ManagerStateError,
    OutOfMemoryError,
    PlanningError,
    RegistrationError,
    ReleasedError,
    RunLengthMismatchError,
    UnchunkableTooLargeError,
    UnknownAllocatorError,
)
from ._history import EventKind, History, HistoryEvent
from ._manager import MemoryManager, PendingRequest, default_manager
from ._options import Options, Policy
from ._planner import ChunkPlan, offered_bytes, plan_batch
from ._plot import render as render_history
from ._recorder import Recorder
from ._requests import ArrayRequest, ArrayResponse, MemoryKind
from ._stats import (
    GroupStatistics,
    ManagerStatistics,
    MemberStatistics,
    Percentiles,
    PinnedStats,
    RecoveryStats,
    Snapshot,
    UsageStats,
)
from ._walk import DEFAULT_DEPTH, Chunk, walk_batches, walk_chunks, walk_requests

__version__ = "0.2.0.dev0"

__all__ = [
    "DEFAULT_DEPTH",
    "MIN_AUTO_POOL",
    "AiocubieError",
    "AiocubieWarning",
    "AllocationError",
    "ArrayRequest",
    "ArrayResponse",
    "Backend",
    "BackendError",
    "BudgetError",
    "Chunk",
    "ChunkPlan",
    "ConfigurationError",
    "ContextResetError",
    "DeviceSet",
    "Engines",
    "Event",
    "EventKind",
    "Faults",
    "GroupStatistics",
    "History",
    "HistoryEvent",
    "InsufficientMemoryError",
    "InvalidRequestError",
    "LimitMode",
    "ManagerStateError",
    "ManagerStatistics",
    "MemberStatistics",
    "MemoryInfo",
    "MemoryKind",
    "MemoryManager",
    "Options",
    "OutOfMemoryError",
    "PendingRequest",
    "Percentiles",
    "PinnedStats",
    "PlanningError",
    "Policy",
    "Recorder",
    "RecoveryStats",
    "RegistrationError",
    "ReleasedError",
    "RunLengthMismatchError",
    "SimulatorBackend",
    "Snapshot",
    "TimelineEntry",
    "UnchunkableTooLargeError",
    "UnknownAllocatorError",
    "UsageStats",
    "create_backend",
    "current_cupy_stream",
    "default_manager",
    "device_count",
    "gpu_status",
    "offered_bytes",
    "plan_batch",
    "render_history",
    "select_backend",
    "walk_batches",
    "walk_chunks",
    "walk_requests",
]
