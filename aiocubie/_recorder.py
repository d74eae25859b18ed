"""Observability over time: take ``mgr.stats()`` snapshots at an interval, for plots and logs.

A snapshot costs a few dict copies and no device call beyond one memory reading, so recording
at millisecond intervals is cheap. It never changes the manager's state.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol

import anyio
import anyio.abc

from ._errors import ConfigurationError
from ._stats import Snapshot

__all__ = ["Recorder"]


class Observed(Protocol):
    """What a recorder observes: a :class:`~aiocubie.MemoryManager`, or anything with its ``stats()``."""

    def stats(self) -> Snapshot:
        """The manager's statistics now."""


class Recorder:
    """Record a manager's :class:`Snapshot` every ``interval`` seconds.

    Use it as ``async with Recorder(mgr, 0.01) as recorder:`` around the work (one snapshot at
    entry, one every interval, one at exit), or run :meth:`run` in a task group of your own.

    Parameters
    ----------
    mgr : MemoryManager
        The manager to observe (anything with its ``stats()``).
    interval : float
        Seconds between snapshots (> 0).

    Attributes
    ----------
    snapshots : list of Snapshot
        Every snapshot taken so far, oldest first.

    Examples
    --------
    >>> import anyio
    >>> from aiocubie import ArrayRequest, MemoryManager
    >>> from aiocubie.simulator import SimulatorBackend
    >>> from aiocubie.stats import Recorder
    >>> async def main():
    ...     with SimulatorBackend(total=1 << 20) as sim:
    ...         async with MemoryManager(sim) as mgr, Recorder(mgr, interval=0.005) as recorder:
    ...             solver = object()
    ...             mgr.register(solver, stream_group="solve")
    ...             async with mgr.request(solver, {"x": ArrayRequest((1024,), "float32")}):
    ...                 await anyio.sleep(0.02)
    ...     return recorder.series("solve")
    >>> times, live = anyio.run(main)
    >>> max(live)  # 4 KiB live while the request was held
    4096
    """

    def __init__(self, mgr: Observed, interval: float = 0.01) -> None:
        if not (isinstance(interval, (int, float)) and interval > 0):
            raise ConfigurationError(f"interval must be a positive number of seconds, got {interval!r}")
        self.mgr = mgr
        self.interval = float(interval)
        self.snapshots: list[Snapshot] = []
        self._task_group: anyio.abc.TaskGroup | None = None

    def take(self) -> Snapshot:
        """Take one snapshot now and keep it."""
        snapshot = self.mgr.stats()
        self.snapshots.append(snapshot)
        return snapshot

    async def run(self) -> None:
        """Take a snapshot every ``interval`` seconds until cancelled."""
        self.take()
        await self._every_interval()

    async def _every_interval(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            self.take()

    async def __aenter__(self) -> Recorder:
        if self._task_group is not None:
            raise ConfigurationError("this recorder is already recording")
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self.take()  # now, not when the task first runs: the work may have started by then
        task_group.start_soon(self._every_interval)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        task_group, self._task_group = self._task_group, None
        assert task_group is not None
        task_group.cancel_scope.cancel()
        await task_group.__aexit__(exc_type, exc, tb)
        self.take()
        return None

    def series(self, group: str | None = None) -> tuple[list[float], list[int]]:
        """Seconds since the first snapshot, and live VRAM bytes of ``group`` (None: all).

        A group that did not exist yet at a snapshot counts as 0 bytes there.
        """
        if not self.snapshots:
            return [], []
        start = self.snapshots[0].time
        times = [s.time - start for s in self.snapshots]
        if group is None:
            return times, [s.live_bytes for s in self.snapshots]
        return times, [s.groups[group].live_bytes if group in s.groups else 0 for s in self.snapshots]
