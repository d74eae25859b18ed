"""Spilling: idle spillable arrays copied to pinned host memory to make room, and brought back in ``use()``.

Handed the account's seam (:class:`SpillAccount`: the device, evicting and grafting allocations) and how
a member asks for memory (a request like any other): it writes neither the ledger nor the resource
itself, and knows nothing of tickets, schedulers or the manager.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Hashable, Iterable, Sequence
from typing import Any, Protocol

import anyio
import attrs
import numpy as np

from ._backends import Device, Event
from ._completion import running_loop
from ._errors import AiocubieError
from ._lease import SpilledArray
from ._ledger import Allocation
from ._options import Options
from ._policy import Totals
from ._requests import ArrayRequest, ArrayResponse, RequestSet, check_requests
from ._stats import SpillStats

__all__ = ["Serve", "SpillAccount", "SpillRecord", "Spills", "spill_room"]

log = logging.getLogger("aiocubie")

#: How a restore asks for memory: ``serve(member_key, requests, priority)``, a request of the member like any
#: other, at the priority of the response it restores.
Serve = Callable[[Any, RequestSet, int], Awaitable[ArrayResponse]]


class SpillAccount(Protocol):
    """What spilling uses of the device account (see :class:`~aiocubie._accounting.DeviceAccount`)."""

    @property
    def device(self) -> Device:
        """The device: streams, events, copies, the pinned pool."""

    def evict(self, allocations: list[Allocation]) -> int:
        """``allocations`` went to host: out of the ledger's totals, their blocks back; the bytes freed."""

    def graft(self, source: ArrayResponse, owner: ArrayResponse, labels: dict[str, str]) -> list[Allocation] | None:
        """Move ``source``'s allocations to ``owner`` (relabelled) and return them; None if either was released."""

    def release(self, response: ArrayResponse | None) -> bool:
        """Free ``response``'s arrays."""


class _State(enum.Enum):
    RESIDENT = "resident"
    SPILLING = "spilling"
    SPILLED = "spilled"
    RESTORING = "restoring"


@attrs.define(eq=False)
class _Entry:
    """One spillable allocation (an array, or one of its chunk buffers) and its host copy while spilled."""

    alloc: Allocation
    label: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    nbytes: int
    buffer: np.ndarray[Any, Any] | None = None  # the pinned pool's buffer under ``host``
    host: np.ndarray[Any, Any] | None = None


_NONE = SpillStats()

# How a spill, a restore and host copies dropped change a SpillStats: it is frozen, so each count makes
# a new one (spills are rare); what stats() hands out is the object itself.


def _spilled(stats: SpillStats, nbytes: int, seconds: float) -> SpillStats:
    now = stats.now + nbytes
    return attrs.evolve(
        stats,
        now=now,
        peak=max(stats.peak, now),
        spills=stats.spills + 1,
        spilled_bytes=stats.spilled_bytes + nbytes,
        spill_seconds=stats.spill_seconds + seconds,
    )


def _restored(stats: SpillStats, nbytes: int, seconds: float) -> SpillStats:
    return attrs.evolve(
        stats,
        now=stats.now - nbytes,
        restores=stats.restores + 1,
        restored_bytes=stats.restored_bytes + nbytes,
        restore_seconds=stats.restore_seconds + seconds,
    )


def _dropped(stats: SpillStats, nbytes: int, seconds: float) -> SpillStats:
    return attrs.evolve(stats, now=stats.now - nbytes)


class _Prioritised(Protocol):
    @property
    def priority(self) -> int: ...


class _Planner(Protocol):
    @property
    def spills(self) -> Spills | None: ...

    @property
    def options(self) -> Options: ...


def spill_room(
    account: _Planner,
    batch: Sequence[_Prioritised],
    totals: Totals,
    offered: int,
    members: Collection[Hashable],
) -> Callable[[], Awaitable[int]] | None:
    """What to spill before ``batch`` (of a group of ``members``) waits, is chunked or fails: None if nothing may.

    ``offered`` bytes fall short of the batch's ``totals``; spilling frees device memory, of which the
    group is offered at least ``1 - headroom``. In passive mode any group's idle arrays may spill; in
    active mode only those of ``members`` (they free the group's cap). Never of a higher priority than
    the batch's highest.
    """
    spills, options = account.spills, account.options
    if spills is None or not spills.records:
        return None
    priority = max(t.priority for t in batch)
    keys = frozenset(members) if options.active else None
    if not spills.candidates(priority, keys):
        return None
    short = totals.fixed + totals.per_run * totals.runs - offered
    return functools.partial(spills.make_room, math.ceil(short / (1 - options.headroom)), priority, keys)


class SpillRecord:
    """The spill state of one response's spillable arrays (its lease's ``spill``); only :class:`Spills` writes it."""

    def __init__(self, spills: Spills, response: ArrayResponse, entries: list[_Entry]) -> None:
        self.spills, self.response, self.entries = spills, response, entries
        self.key, self._group = entries[0].alloc.key, entries[0].alloc.group
        self.state = _State.RESIDENT
        self.pins = 0  # use() blocks under way
        self.used = time.monotonic()
        self.dropped = False  # released: nothing to restore, host copies go back
        self.restoring: anyio.Event | None = None
        self.lost: list[_Entry] = []  # released while a spill copied them: their buffers go back after
        self.failed = False  # its last spill failed (a copy): not tried again until it is used
        self.touched = False  # used while a spill copied it: the copy may be stale, the spill is called off

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.entries)

    @property
    def group(self) -> str:
        """Its member's group now (a member that moves takes what it holds along)."""
        return self.entries[0].alloc.group if self.entries else self._group

    @property
    def spilled(self) -> bool:
        """On host now (spilled, or being restored)."""
        return self.state is _State.SPILLED or self.state is _State.RESTORING

    @property
    def priority(self) -> int:
        return self.response.lease.priority

    @property
    def idle(self) -> bool:
        """Resident and in no ``use()`` block: it may be spilled."""
        return self.state is _State.RESIDENT and not (self.pins or self.dropped or self.failed)

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[dict[str, Any]]:
        """The response's arrays made resident and pinned while the block runs."""
        self.pins += 1
        self.failed = False
        self.touched = self.touched or self.state is _State.SPILLING
        try:
            while not self.dropped and (self.state is _State.SPILLED or self.state is _State.RESTORING):
                if self.restoring is not None:
                    await self.restoring.wait()
                else:
                    await self.spills.restore(self)
            yield self.response.arrays
        finally:
            self.pins -= 1
            self.used = time.monotonic()

    def released(self, labels: Iterable[str]) -> None:
        """The arrays of ``labels`` were freed (a release, a reset, the manager's exit): drop their host copies."""
        gone = set(labels)
        kept = [e for e in self.entries if e.label not in gone]
        if len(kept) == len(self.entries):
            return
        lost = [e for e in self.entries if e.label in gone]
        self.entries = kept
        if self.state is _State.SPILLING:  # its copies may still write the buffers: they go back when they end
            self.lost += lost
        else:
            self.spills.unpin(self, lost)
        if not kept:
            self.dropped = True
            self.spills.forget(self)


class Spills:
    """Every spillable response of one account: spilling to make room, restoring in ``use()``, the counts.

    Parameters
    ----------
    account : SpillAccount
        The device, and where evicted and restored allocations are entered.
    serve : Serve
        How a restore asks for its memory: a request of the response's member like any other.
    """

    def __init__(self, account: SpillAccount, serve: Serve) -> None:
        self._account = account
        self._serve = serve
        self.records: dict[int, SpillRecord] = {}
        self.total = SpillStats()
        self.by_key: dict[Hashable, SpillStats] = {}
        self.by_group: dict[str, SpillStats] = {}

    def track(self, response: ArrayResponse, allocations: list[Allocation], labels: Collection[str]) -> None:
        """``response`` holds spillable arrays (``labels``): they may be spilled while it is not in ``use()``."""
        entries = [
            _Entry(a, a.label, tuple(a.array.shape), np.dtype(a.array.dtype), a.vram)
            for a in allocations
            if a.label in labels and a.vram
        ]
        if entries:
            record = response.lease.spill = SpillRecord(self, response, entries)
            self.records[id(response)] = record

    def forget(self, record: SpillRecord) -> None:
        """``record``'s response was released: stop tracking it."""
        self.records.pop(id(record.response), None)
        record.response.lease.spill = None

    def key_stats(self, key: Hashable) -> SpillStats:
        """The spilling of member ``key`` so far."""
        return self.by_key.get(key, _NONE)

    def group_stats(self, group: str) -> SpillStats:
        """The spilling of the members of ``group`` so far (counted where each spill and restore was)."""
        return self.by_group.get(group, _NONE)

    def spilled(self) -> int:
        """Responses whose spillable arrays are on host now."""
        return sum(record.spilled for record in self.records.values())

    # -- making room ---------------------------------------------------------------------------
    def candidates(self, priority: int, keys: Collection[Hashable] | None = None) -> list[SpillRecord]:
        """Idle records a request at ``priority`` may spill (of ``keys`` only, if given): lowest
        priority first, then least recently used; never one of a higher priority."""
        found = [
            r for r in self.records.values() if r.idle and r.priority <= priority and (keys is None or r.key in keys)
        ]
        found.sort(key=lambda r: (r.priority, r.used))
        return found

    async def make_room(self, nbytes: int, priority: int = 0, keys: Collection[Hashable] | None = None) -> int:
        """Spill idle arrays (see :meth:`candidates`) until ``nbytes`` are freed or none is left; the bytes freed.

        Shielded from cancellation: each array ends resident or spilled, its data intact.
        """
        chosen: list[SpillRecord] = []
        total = 0
        for record in self.candidates(priority, keys):
            if total >= nbytes:
                break
            chosen.append(record)
            total += record.nbytes
        freed = 0
        if chosen:
            with anyio.CancelScope(shield=True):
                freed = await self._spill(chosen)
        return freed

    async def _spill(self, records: list[SpillRecord]) -> int:
        started: list[tuple[SpillRecord, Event, float]] = []
        for record in records:
            began = time.perf_counter()
            try:
                started.append((record, self._start(record), began))
            except AiocubieError as exc:  # a failed copy: the array stays resident, as it was
                record.failed = True
                log.warning("spilling a response's arrays of %r failed, they stay on the device: %s", record.group, exc)
        loop, freed = running_loop(), 0
        for record, done, began in started:
            try:
                await loop.wait(done)
            except AiocubieError as exc:
                log.warning("a spill copy of %r failed, the arrays stay on the device: %s", record.group, exc)
                self._abort(record)
                record.failed = True
                continue
            freed += self._finish(record, began)
        return freed

    def _start(self, record: SpillRecord) -> Event:
        """Queue the copies to host after the work queued on the arrays' stream; the event they end at."""
        device, response = self._account.device, record.response
        stream = response.stream
        copy_streams = response._copy_streams
        target = copy_streams()[1] if copy_streams is not None else stream
        record.state, record.touched = _State.SPILLING, False
        # as a walk's copies do: a release while they run frees the blocks only once they are done
        response.lease.walk_started()
        try:
            if target is not stream:
                device.wait_event(target, device.record_event(stream))
            pool = device.pinned_pool
            for entry in record.entries:
                entry.buffer = pool.acquire(entry.nbytes)
                entry.host = entry.buffer[: entry.nbytes].view(entry.dtype).reshape(entry.shape)
                device.copy(entry.alloc.array, entry.host, target, tag="spill")
            return device.record_event(target)
        except BaseException:
            with contextlib.suppress(AiocubieError):  # the copies queued before the failure end first (rare: faults)
                device.record_event(target).synchronize()
            self._abort(record)
            raise

    def _abort(self, record: SpillRecord) -> None:
        """A spill that did not happen (a failed copy, or the arrays were used meanwhile): resident as before."""
        self.unpin(record, [*record.entries, *record.lost])
        record.lost = []
        record.state = _State.RESIDENT
        record.response.lease.walk_ended()  # a release meanwhile frees the blocks now

    def unpin(self, record: SpillRecord, entries: list[_Entry]) -> None:
        """Give the host copies of ``entries`` back to the pinned pool (what was on host leaves the counts)."""
        pool = self._account.device.pinned_pool
        gone = 0
        for entry in entries:
            if entry.buffer is not None:
                pool.release(entry.buffer)
                gone += entry.nbytes
            entry.buffer = entry.host = None
        if gone and record.spilled:
            self._count(record, _dropped, gone, 0.0)

    def _count(
        self, record: SpillRecord, change: Callable[[SpillStats, int, float], SpillStats], nbytes: int, seconds: float
    ) -> None:
        """Count a spill, a restore or host copies dropped of ``record`` for the manager, its member and its group."""
        self.total = change(self.total, nbytes, seconds)
        key, group = record.key, record.group
        self.by_key[key] = change(self.by_key.get(key, _NONE), nbytes, seconds)
        self.by_group[group] = change(self.by_group.get(group, _NONE), nbytes, seconds)

    def _finish(self, record: SpillRecord, began: float) -> int:
        """The copies are done: free the device memory (unless the arrays were used or released meanwhile: a
        ``use()`` block that began and ended during the copy may have written them). A spill's time runs
        from ``began`` (its copies queued) to its memory freed."""
        if record.pins or record.dropped or record.lost or record.touched:
            self._abort(record)
            return 0
        device, lease = self._account.device, record.response.lease
        for entry in record.entries:
            device.spilled(entry.alloc.block)
        by_label: dict[str, list[Any]] = {}
        for entry in record.entries:
            by_label.setdefault(entry.label, []).append(SpilledArray(entry.label, entry.shape, entry.dtype))
        freed = self._account.evict([e.alloc for e in record.entries])
        for label, stand_ins in by_label.items():
            lease.swap(label, stand_ins)
        record.state = _State.SPILLED
        lease.walk_ended()
        seconds = time.perf_counter() - began
        self._count(record, _spilled, record.nbytes, seconds)
        return freed

    # -- restoring -----------------------------------------------------------------------------
    async def restore(self, record: SpillRecord) -> None:
        """Bring ``record``'s arrays back: ask for the memory (a request like any other), copy, graft.

        Cancelled or failed before the memory is there, the arrays stay spilled; once it is, the
        copy is shielded: the arrays end resident.
        """
        record.state, record.restoring = _State.RESTORING, anyio.Event()
        began = time.perf_counter()
        try:
            labels = [e.label for e in record.entries]  # a label's chunk buffers are told apart by their index
            names = {
                (e.label if labels.count(e.label) == 1 else f"{e.label}#{i}"): e for i, e in enumerate(record.entries)
            }
            requests = check_requests({n: ArrayRequest(e.shape, e.dtype, unchunkable=True) for n, e in names.items()})
            fresh = await self._serve(record.key, requests, record.priority)
            kept = {id(e) for e in record.entries}
            if record.dropped or any(id(e) not in kept for e in names.values()):
                # released (whole or in part) while the memory was awaited: those host copies went back to the
                # pinned pool; what is left restores on use()'s next turn (nothing, if the whole was released)
                self._account.release(fresh)
                return
            with anyio.CancelScope(shield=True):
                await self._copy_back(record, fresh, names, began)
        finally:
            if record.state is _State.RESTORING:
                record.state = _State.SPILLED
            record.restoring.set()
            record.restoring = None

    async def _copy_back(
        self, record: SpillRecord, fresh: ArrayResponse, names: dict[str, _Entry], began: float
    ) -> None:
        account = self._account
        device = account.device
        try:
            for name, entry in names.items():
                device.copy(entry.host, fresh.arrays[name], fresh.stream, tag="restore")
            await running_loop().wait(device.record_event(fresh.stream))
        except BaseException:
            account.release(fresh)
            raise
        arrays = dict(fresh.arrays)  # the graft hands the fresh response's arrays to the record's
        moved = (
            None if record.dropped else account.graft(fresh, record.response, {n: e.label for n, e in names.items()})
        )
        if moved is None:
            account.release(fresh)
            return
        by_label: dict[str, list[Any]] = {}
        for name, entry in names.items():
            entry.alloc = next(a for a in moved if a.array is arrays[name])
            by_label.setdefault(entry.label, []).append(arrays[name])
        for label, restored in by_label.items():
            record.response.lease.swap(label, restored)
        record.state = _State.RESIDENT
        self.unpin(record, record.entries)
        self._count(record, _restored, record.nbytes, time.perf_counter() - began)
