"""Observability: counters and latency samples per stream group and per instance.

Recording is a few integer adds and a deque append per request, cheap enough to stay on.
Pure: no device calls, no event loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

import attrs
import numpy as np

__all__ = ["Counters", "Percentiles", "PinnedStats", "Snapshot", "Telemetry", "UsageStats"]

#: Latency samples kept per group and instance (the most recent ones).
SAMPLES = 4096
#: Departed groups and instances whose counters stats keep showing (the most recent ones).
DEPARTED = 256


@attrs.frozen
class Percentiles:
    """Latency percentiles in seconds over the most recent samples (None when there are none)."""

    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, samples: Iterable[float]) -> Percentiles:
        """Percentiles of ``samples``."""
        data = np.fromiter(samples, dtype=np.float64)
        if not data.size:
            return cls(0, None, None, None, None)
        p50, p90, p99 = np.percentile(data, [50, 90, 99])
        return cls(int(data.size), float(p50), float(p90), float(p99), float(data.max()))


class Counters:
    """Mutable counters for one group or one instance."""

    def __init__(self) -> None:
        self.requests = 0
        self.batches = 0
        self.chunks = 0
        self.failures = 0
        self.cancellations = 0
        self.peak_bytes = 0  # kept here when an instance leaves (the ledger forgets its id)
        self.queue_wait: deque[float] = deque(maxlen=SAMPLES)
        self.ready_latency: deque[float] = deque(maxlen=SAMPLES)


class Telemetry:
    """The counters of every stream group and every instance (by name), made on first use.

    A departed instance's (or emptied group's) counters outlive it, under its name, so stats
    still show what it did; only the ``departed`` most recent departed ones are kept, so a
    program that registers without end holds bounded memory. A name used again takes its
    counters back.
    """

    def __init__(self, departed: int = DEPARTED) -> None:
        self.groups: dict[str, Counters] = {}
        self.instances: dict[str, Counters] = {}
        self._limit = departed
        self._departed_groups: dict[str, None] = {}  # insertion-ordered sets, oldest first
        self._departed_instances: dict[str, None] = {}

    def group(self, name: str) -> Counters:
        """The counters of group ``name``."""
        counters = self.groups.get(name)
        if counters is None:  # not setdefault: that would build a Counters on every call
            counters = self.groups[name] = Counters()
        self._departed_groups.pop(name, None)
        return counters

    def instance(self, name: str) -> Counters:
        """The counters of the instance named ``name``."""
        counters = self.instances.get(name)
        if counters is None:
            counters = self.instances[name] = Counters()
        self._departed_instances.pop(name, None)
        return counters

    def retire_group(self, name: str) -> None:
        """Group ``name`` is gone: keep its counters among the most recent departed ones."""
        self._retire(name, self._departed_groups, self.groups)

    def retire_instance(self, name: str) -> None:
        """The instance named ``name`` left: keep its counters among the most recent departed ones."""
        self._retire(name, self._departed_instances, self.instances)

    def _retire(self, name: str, departed: dict[str, None], live: dict[str, Counters]) -> None:
        departed.pop(name, None)
        departed[name] = None
        while len(departed) > self._limit:
            oldest = next(iter(departed))
            del departed[oldest]
            live.pop(oldest, None)


@attrs.frozen
class UsageStats:
    """A frozen view of one group's or instance's activity.

    ``queue_wait``: from ``await request`` to the batch being allocated. ``ready_latency``:
    from the allocation's event being recorded to the request resolving.
    """

    live_bytes: int
    peak_bytes: int
    requests: int
    batches: int
    chunks: int
    failures: int
    cancellations: int
    queue_wait: Percentiles
    ready_latency: Percentiles
    #: Active mode: the group's cap (sum of its members' caps) or the instance's cap; else None.
    cap_bytes: int | None = None

    @property
    def over_cap(self) -> bool:
        """True when it holds more than its cap (active mode): its group starts no new batch
        until enough is released. Members moving between groups or joining the auto pool can
        shrink a cap below what is held already."""
        return self.cap_bytes is not None and self.live_bytes > self.cap_bytes

    @classmethod
    def of(cls, counters: Counters, live: int, peak: int, cap: int | None = None) -> UsageStats:
        """Freeze ``counters`` with the ledger's ``live`` and ``peak`` bytes (and the ``cap``)."""
        return cls(
            live,
            peak,
            counters.requests,
            counters.batches,
            counters.chunks,
            counters.failures,
            counters.cancellations,
            Percentiles.of(counters.queue_wait),
            Percentiles.of(counters.ready_latency),
            cap,
        )


@attrs.frozen
class PinnedStats:
    """Page-locked host memory of the backend's staging pool (walks, ``create_host_array(pool=True)``).

    ``held``: bytes pinned and kept (in use or free for reuse); ``in_use``: bytes asked for
    by the buffers handed out now; ``peak_in_use``: the most asked for at once, against which
    to read ``held``; ``pinned``: buffers pinned so far (reuse pins none).
    """

    held: int = 0
    in_use: int = 0
    peak_in_use: int = 0
    pinned: int = 0


@attrs.frozen
class Snapshot:
    """Everything :meth:`MemoryManager.stats` reports at one moment.

    Attributes
    ----------
    time : float
        ``time.monotonic()`` when it was taken.
    free, total : int
        Device memory as the backend last reported it.
    live_bytes, peak_bytes : int
        VRAM held through the manager, now and at its highest.
    groups, instances : dict
        Name -> :class:`UsageStats`.
    pinned : PinnedStats
        The pinned staging pool: bytes held against bytes needed.
    """

    time: float
    free: int
    total: int
    live_bytes: int
    peak_bytes: int
    groups: dict[str, UsageStats]
    instances: dict[str, UsageStats]
    pinned: PinnedStats = PinnedStats()

    @staticmethod
    def now() -> float:
        """The clock snapshots use."""
        return time.monotonic()
