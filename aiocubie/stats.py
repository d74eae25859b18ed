"""What a manager reports: statistics, snapshots over time, and the allocation history.

``mgr.stats()`` returns a :class:`Snapshot`, ``mgr.statistics()`` a :class:`ManagerStatistics`,
``mgr.pool.memory_info()`` a :class:`MemoryInfo` and ``mgr.history()`` a :class:`History` (which
exports itself for Perfetto and torch's memory viewer); :class:`Recorder` takes snapshots at an
interval and :func:`render_history` draws a history.
"""

from ._backends import MemoryInfo
from ._history import EventKind, History, HistoryEvent
from ._plot import render as render_history
from ._recorder import Recorder
from ._stats import (
    GroupStatistics,
    LeaseStatistics,
    ManagerStatistics,
    MemberStatistics,
    Percentiles,
    PinnedStats,
    RecoveryStats,
    Snapshot,
    SpillStats,
    UsageStats,
)

__all__ = [
    "EventKind",
    "GroupStatistics",
    "History",
    "HistoryEvent",
    "LeaseStatistics",
    "ManagerStatistics",
    "MemberStatistics",
    "MemoryInfo",
    "Percentiles",
    "PinnedStats",
    "Recorder",
    "RecoveryStats",
    "Snapshot",
    "SpillStats",
    "UsageStats",
    "render_history",
]
