"""Observability: counters and latency samples per stream group and per instance, and their reports.

Recording is a few integer adds and a deque append per request, cheap enough to stay on.
Pure: no device calls, no event loop, no I/O (a report is a string the caller prints).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import attrs
import numpy as np

from ._backends._resource import PoolFacts

__all__ = [
    "Counters",
    "GroupStatistics",
    "LeaseStatistics",
    "ManagerStatistics",
    "MemberStatistics",
    "Percentiles",
    "PinnedStats",
    "RecoveryStats",
    "Snapshot",
    "SpillStats",
    "Telemetry",
    "UsageStats",
    "format_bytes",
    "format_seconds",
    "summary",
]

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
        self.express = 0  # of the requests, those served by the express path (GroupScheduler.express)
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
        #: priority -> its requests' queue waits (the ``departed`` most recently made priorities)
        self.priorities: dict[int, deque[float]] = {}

    def waits(self, priority: int) -> deque[float]:
        """The queue-wait samples of requests of ``priority``, made on first use."""
        samples = self.priorities.get(priority)
        if samples is None:
            samples = self.priorities[priority] = deque(maxlen=SAMPLES)
            while len(self.priorities) > self._limit:
                del self.priorities[next(iter(self.priorities))]
        return samples

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
class SpillStats:
    """Spilling of one component, one group or the manager (``now`` and ``peak``: bytes on host).

    Attributes
    ----------
    now, peak : int
        Bytes spilled to host now, and the most at once.
    spills, spilled_bytes : int
        Spills done and the bytes they moved to host.
    spill_seconds : float
        Time from queueing a spill's copies to freeing its device memory, summed.
    restores, restored_bytes : int
        Restores done (in ``use()``) and the bytes they brought back.
    restore_seconds : float
        Time from asking for the memory to the data being back, summed.
    """

    now: int = 0
    peak: int = 0
    spills: int = 0
    spilled_bytes: int = 0
    spill_seconds: float = 0.0
    restores: int = 0
    restored_bytes: int = 0
    restore_seconds: float = 0.0


@attrs.frozen
class UsageStats:
    """A frozen view of one group's or instance's activity.

    ``queue_wait``: from ``await request`` to the batch being allocated. ``ready_latency``:
    from the allocation's event being recorded to the request resolving. ``express``: of the
    ``requests``, those served by the express path (in the awaiting task, no queue, the last plan:
    docs/performance-notes-request.md); each is a batch of one.
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
    express: int = 0
    #: Its spillable arrays moved to host and back (see :class:`SpillStats`).
    spill: SpillStats = SpillStats()

    @property
    def over_cap(self) -> bool:
        """True when it holds more than its cap (active mode): its group starts no new batch
        until enough is released. Members moving between groups or joining the auto pool can
        shrink a cap below what is held already."""
        return self.cap_bytes is not None and self.live_bytes > self.cap_bytes

    @classmethod
    def of(
        cls, counters: Counters, live: int, peak: int, cap: int | None = None, spill: SpillStats = SpillStats()
    ) -> UsageStats:
        """Freeze ``counters`` with the ledger's ``live`` and ``peak`` bytes (and the ``cap``, and its ``spill``)."""
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
            counters.express,
            spill,
        )


@attrs.frozen
class PinnedStats:
    """Page-locked host memory of the backend's staging pool (walks, ``mgr.host.array(pool=True)``).

    ``held``: bytes pinned and kept (in use or free for reuse); ``in_use``: bytes asked for
    by the buffers handed out now; ``peak_in_use``: the most asked for at once, against which
    to read ``held``; ``pinned``: buffers pinned so far (reuse pins none).
    """

    held: int = 0
    in_use: int = 0
    peak_in_use: int = 0
    pinned: int = 0


@attrs.frozen
class RecoveryStats:
    """Out-of-memory recovery so far (see :meth:`PoolView.add_reclaim_hook`).

    ``out_of_memory``: allocations that found no room at first; ``cache_releases`` and
    ``cache_bytes_freed``: step 1, the pool's cached blocks given back to the device;
    ``hook_calls`` and ``hook_bytes_freed``: step 2, reclaim hooks called and the bytes they
    said they freed (async hooks, awaited before a batch that does not fit whole waits, chunks
    or fails, count here too; ``hook_timeouts``: rounds of them cut off by ``reclaim_timeout``);
    ``recovered``: allocations that succeeded on a retry (another library's:
    retried once the recovery freed pool memory; one that finds no room again is a new
    out-of-memory); ``failed``: those that failed after every step.
    """

    out_of_memory: int = 0
    cache_releases: int = 0
    cache_bytes_freed: int = 0
    hook_calls: int = 0
    hook_bytes_freed: int = 0
    hook_timeouts: int = 0
    recovered: int = 0
    failed: int = 0


@attrs.frozen
class Snapshot:
    """Everything :meth:`MemoryManager.stats` reports at one moment.

    Units: bytes for memory, seconds for times and latencies.

    Attributes
    ----------
    time : float
        ``time.monotonic()`` when it was taken.
    free, total : int
        Device memory as the backend last reported it.
    live_bytes, peak_bytes : int
        VRAM held through the manager, now and at its highest (since the last
        :meth:`MemoryManager.reset_peaks`).
    groups, instances : dict
        Name -> :class:`UsageStats`.
    pinned : PinnedStats
        The pinned staging pool: bytes held against bytes needed.
    wall_time : float
        ``time.time()`` when it was taken (seconds since the epoch).
    pool : PoolFacts
        The device allocator's pool: bytes held against bytes in use, largest cached block.
    recovery : RecoveryStats
        Out-of-memory recovery steps taken so far.
    waits_by_priority : dict
        Priority -> :class:`Percentiles` of its requests' queue waits (from ``await request`` to
        the batch being allocated), over every group.
    spill : SpillStats
        Spillable arrays moved to host and back, every member together.
    other_bytes : int or None
        Device bytes the allocator's pool has in use that this manager does not hold: what other
        libraries drawing from the same pool hold (CuPy, numba, torch through ``mgr.pool.share``; RAPIDS
        on RMM), and arrays released here but still referenced. ``pool.in_use`` is ``live_bytes``
        (device kinds) plus this. None where the pool cannot say.
    """

    time: float
    free: int
    total: int
    live_bytes: int
    peak_bytes: int
    groups: dict[str, UsageStats]
    instances: dict[str, UsageStats]
    pinned: PinnedStats = PinnedStats()
    wall_time: float = 0.0
    pool: PoolFacts = PoolFacts()  # noqa: RUF009 - frozen
    recovery: RecoveryStats = RecoveryStats()
    other_bytes: int | None = None
    waits_by_priority: dict[int, Percentiles] = attrs.field(factory=dict)
    spill: SpillStats = SpillStats()

    @staticmethod
    def now() -> float:
        """The clock snapshots use."""
        return time.monotonic()

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as plain JSON-serialisable values (``json.dumps`` takes it as is).

        Memory is in bytes, times and latencies in seconds: ``time`` is ``time.monotonic()``
        and ``wall_time`` seconds since the epoch; unknown values are None. Each group and
        instance also gets ``over_cap``.
        """
        data = attrs.asdict(self)
        for name in ("groups", "instances"):
            for usage, entry in zip(getattr(self, name).values(), data[name].values()):
                entry["over_cap"] = usage.over_cap
        return data


@attrs.frozen
class GroupStatistics:
    """The requests a stream group's scheduler holds, by stage (see :class:`ManagerStatistics`).

    ``queued``: waiting for a batch; ``planning``: in the batch being planned or waiting for
    memory; ``in_flight``: allocated, waiting for the device; ``ending``: cancelled or failed
    while in flight, their arrays kept until the device is done with them; ``by_priority``:
    the queued and planning ones by priority.
    """

    queued: int = 0
    planning: int = 0
    in_flight: int = 0
    ending: int = 0
    by_priority: dict[int, int] = attrs.field(factory=dict)

    @property
    def pending(self) -> int:
        """Every request the group's scheduler still holds."""
        return self.queued + self.planning + self.in_flight + self.ending


@attrs.frozen
class MemberStatistics:
    """A registered instance: its stream group, and whether its share is manual (else auto)."""

    group: str
    manual: bool


@attrs.frozen
class LeaseStatistics:
    """A manager's lease from the node broker (``MemoryManager(broker=PATH)``), in ``statistics().lease``.

    Attributes
    ----------
    socket : str
        The broker's socket.
    connected : bool
        Connected now (False before the first lease, or after the broker went away).
    granted : int
        Bytes leased now; the manager's device memory stays within them.
    used : int
        Bytes of the lease the manager holds arrays in.
    slab : int
        The bytes leased at a time (the broker's; 0 before the first connection).
    leases : int
        Lease round trips so far (a request its lease covers makes none).
    returns : int
        Idle slabs given back so far.
    """

    socket: str
    connected: bool
    granted: int
    used: int
    slab: int
    leases: int
    returns: int


@attrs.frozen
class ManagerStatistics:
    """What :meth:`MemoryManager.statistics` reports: the manager's own state at one moment.

    A read-only snapshot (anyio's ``statistics()`` habit) for tests, debugging and leak checks;
    :class:`Snapshot` (``stats()``) is the one for memory and latencies.

    Attributes
    ----------
    running : bool
        Inside ``async with mgr``.
    groups : dict
        Live stream group -> :class:`GroupStatistics` (empty while not running).
    members : dict
        Instance name -> :class:`MemberStatistics`.
    draining : int
        Emptied groups whose batches are still in flight.
    allocations : int
        Arrays handed out and not released.
    tables : dict
        Entries in each per-group and per-instance table the manager keeps (groups,
        schedulers, members, counters, ledger totals, spillable responses): bounded however
        many come and go.
    lease : LeaseStatistics or None
        Its lease from the node broker (None: no broker).
    spilled : int
        Responses whose spillable arrays are on host now.
    """

    running: bool
    groups: dict[str, GroupStatistics]
    members: dict[str, MemberStatistics]
    draining: int
    allocations: int
    tables: dict[str, int]
    lease: LeaseStatistics | None = None
    spilled: int = 0

    @property
    def pending(self) -> int:
        """Requests the live groups' schedulers still hold (queued, planning or in flight)."""
        return sum(group.pending for group in self.groups.values())


_BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def format_bytes(nbytes: int | None) -> str:
    """``nbytes`` for a person: ``"512 B"``, ``"1.5 KiB"``, ``"12.0 MiB"`` (``"-"`` for None)."""
    if nbytes is None:
        return "-"
    for size, unit in _BYTE_UNITS:
        if abs(nbytes) >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def format_seconds(seconds: float | None) -> str:
    """``seconds`` for a person: ``"850 ns"``, ``"12.3 µs"``, ``"4.1 ms"``, ``"2.00 s"`` (``"-"`` for None)."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e9:.0f} ns"


_COLUMNS = ("live", "peak", "cap", "requests", "batches", "chunks", "fail", "wait p50/p99", "ready p50/p99")


def _row(name: str, usage: UsageStats) -> list[str]:
    wait, ready = usage.queue_wait, usage.ready_latency
    return [
        name,
        format_bytes(usage.live_bytes),
        format_bytes(usage.peak_bytes),
        format_bytes(usage.cap_bytes) + (" OVER" if usage.over_cap else ""),
        str(usage.requests),
        str(usage.batches),
        str(usage.chunks),
        str(usage.failures),
        f"{format_seconds(wait.p50)} / {format_seconds(wait.p99)}",
        f"{format_seconds(ready.p50)} / {format_seconds(ready.p99)}",
    ]


def _table(title: str, rows: list[list[str]]) -> list[str]:
    header = [title, *_COLUMNS]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(width) for cell, width in zip(cells[1:], widths[1:]))]).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(row) for row in rows or [["(none)"] + [""] * 9])]


def _caps_note(snapshot: Snapshot) -> list[str]:
    """A line saying why an instance's peak may be above its cap (none when no peak is)."""
    if any(u.cap_bytes is not None and u.peak_bytes > u.cap_bytes for u in snapshot.instances.values()):
        return [
            "(caps hold per group: an instance may use more than its own cap while its group stays within "
            "the sum of its members' caps)"
        ]
    return []


def _priorities(snapshot: Snapshot) -> list[str]:
    """One line of queue waits per priority (none when every request had priority 0)."""
    waits = snapshot.waits_by_priority
    if not waits or list(waits) == [0]:
        return []
    return [
        f"priority {priority}: {p.count} waits, p50 {format_seconds(p.p50)}, p90 {format_seconds(p.p90)}, "
        f"p99 {format_seconds(p.p99)}"
        for priority, p in sorted(waits.items(), reverse=True)
    ]


def summary(snapshot: Snapshot) -> str:
    """A table of ``snapshot`` a person reads at a glance (see :meth:`MemoryManager.summary`).

    Device memory and the pool first, then one row per stream group and per instance: live,
    peak and cap bytes, requests, batches, chunks, failures, and the queue-wait and ready
    latencies (median / 99th percentile). Then the pinned staging pool, the queue waits per
    priority (when a request had another priority than 0), recovery counts and, once anything
    spilled, spilling (of the manager, each group and each instance).
    """
    pool, pinned, rec = snapshot.pool, snapshot.pinned, snapshot.recovery
    used = snapshot.total - snapshot.free
    lines = [
        f"device: {format_bytes(used)} used of {format_bytes(snapshot.total)} ({format_bytes(snapshot.free)} free); "
        f"through this manager {format_bytes(snapshot.live_bytes)} live, {format_bytes(snapshot.peak_bytes)} peak",
        f"pool: {format_bytes(pool.held)} held, {format_bytes(pool.in_use)} in use, "
        f"{format_bytes(pool.cached)} cached, largest cached block {format_bytes(pool.largest_free)}",
        *(
            [
                f"in the pool: {format_bytes(pool.in_use - snapshot.other_bytes)} through this manager, "
                f"{format_bytes(snapshot.other_bytes)} held by other libraries"
            ]
            if snapshot.other_bytes is not None and pool.in_use is not None
            else []
        ),
        "",
        *_table("group", [_row(name, usage) for name, usage in sorted(snapshot.groups.items())]),
        "",
        *_table("instance", [_row(name, usage) for name, usage in sorted(snapshot.instances.items())]),
        *_caps_note(snapshot),
        "",
        f"pinned staging: {format_bytes(pinned.held)} held, {format_bytes(pinned.in_use)} in use, "
        f"{format_bytes(pinned.peak_in_use)} peak",
        *_priorities(snapshot),
        f"out of memory: {rec.out_of_memory} times; freed {format_bytes(rec.cache_bytes_freed)} cached in "
        f"{rec.cache_releases} releases, {format_bytes(rec.hook_bytes_freed)} by {rec.hook_calls} reclaim-hook "
        f"calls; {rec.recovered} recovered, {rec.failed} failed",
        *_spills(snapshot),
    ]
    return "\n".join(lines)


def _spill_line(name: str, spill: SpillStats) -> str:
    return (
        f"{name}: {format_bytes(spill.now)} on host now, {format_bytes(spill.peak)} peak; {spill.spills} spills "
        f"({format_bytes(spill.spilled_bytes)} in {format_seconds(spill.spill_seconds)}), {spill.restores} restores "
        f"({format_bytes(spill.restored_bytes)} in {format_seconds(spill.restore_seconds)})"
    )


def _spills(snapshot: Snapshot) -> list[str]:
    """The spilling lines of the summary: the manager's, then each group's and instance's that spilled."""
    if not snapshot.spill.spills:
        return []
    lines = [_spill_line("spilled", snapshot.spill)]
    for kind, table in (("group", snapshot.groups), ("instance", snapshot.instances)):
        lines += [_spill_line(f"  {kind} {name}", u.spill) for name, u in sorted(table.items()) if u.spill.spills]
    return lines
