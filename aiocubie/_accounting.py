"""The device account: the resource stack, the budget, the ledger and the free-memory reading, together.

It alone allocates and frees (through its memory resource, arrays made by the backend's array
maker), keeps the ledger in step with the device, says how many bytes a group is offered, hands
each response its lease, and announces what may let a waiting batch through to its listeners. It
is the only writer of the resource stack, the ledger and the budget. Out-of-memory recovery is
:class:`~aiocubie._recovery.Recovery`'s; it knows nothing of tickets, tasks, the loop or the manager.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, Protocol

from ._backends import ArrayMaker, Backend, Device, Event, MemoryInfo, MemoryResource, StreamLike, limiting_adaptors
from ._backends._allocators import Allocator, make_resource
from ._backends._resource import on_failure
from ._broker.client import BrokerLease
from ._budget import Budget, group_available
from ._errors import BudgetError, OutOfMemoryError
from ._lease import Lease
from ._ledger import SPILLED, Allocation, Ledger
from ._options import Options
from ._planner import ChunkPlan, offered_bytes
from ._protocols import RequestLog
from ._recovery import ReclaimHook, Recovery
from ._requests import ArrayResponse, MemoryKind, RequestSet
from ._spill import Spills
from ._stats import format_bytes

__all__ = ["DeviceAccount", "Recording"]

log = logging.getLogger("aiocubie")


class Recording(RequestLog, Protocol):
    """Where the account records plans, allocations, releases, regroupings and resets (and its recovery's steps,
    and its schedulers' requests and waits).

    :class:`~aiocubie._history.HistoryRecorder` is one: the account is handed it (:meth:`DeviceAccount.record_to`).
    """

    def plan(self, group: str, plan: ChunkPlan, requests: int) -> None:
        """A batch of ``requests`` requests of ``group`` is about to be allocated with ``plan``."""

    def allocated(self, batch: Sequence[Sequence[Allocation]], plan: ChunkPlan | None) -> None:
        """A batch was handed out with ``plan``: the allocations of each response (``plan`` None: another library's)."""

    def walked(self, response: object, step: str, index: int) -> None:
        """A walk over ``response`` reached ``step`` of chunk ``index`` (see :class:`~aiocubie._lease.WalkLog`)."""

    def released(self, allocations: Sequence[Allocation], kind: str = "release") -> None:
        """``allocations`` were freed (``kind`` ``"spill"``: their arrays went to host)."""

    def restored(self, group: str, nbytes: int, detail: str) -> None:
        """Spilled arrays of ``group`` (``nbytes``) are back on the device."""

    def regrouped(self, key: Hashable, old: str, new: str, nbytes: int) -> None:
        """What instance ``key`` holds (``nbytes``) counts in group ``new`` from now on."""

    def reset(self, detail: str, *, context: bool = False) -> None:
        """Peak stats were reset (``detail`` says which), or (``context``) every array is about to be forgotten."""


class DeviceAccount:
    """Memory of one device as a manager sees it.

    Parameters
    ----------
    backend : Backend
        The device, the resource to start with and the array maker.
    options : Options
        The manager's options, held here once: read for the mode, the headroom and how long a
        free-memory reading is reused (and by the schedulers); changed with :meth:`configure`.
    reclaim_hooks : list of callable, optional
        Called in order when an allocation is out of memory even after the pool's cached
        blocks were released (see :data:`~aiocubie._recovery.ReclaimHook`); read live.
    allocator : str, MemoryResource or callable, optional
        A resource other than the backend's: a registered name, a resource made on the backend's
        device, or a factory called with the device (None: the backend's resource).
    lease : BrokerLease, optional
        The node broker's lease (``broker=PATH``): free memory is bounded by what it leaves.

    Attributes
    ----------
    history : Recording or None
        Where plans, allocations and releases are recorded (None: nowhere; see :meth:`record_to`).
    recovery : Recovery
        The out-of-memory recovery (its ``stats``: the steps taken so far).
    device : Device
        The device (streams, events, copies, memory readings).
    arrays : ArrayMaker
        Makes the arrays over the resource's blocks.
    resource : MemoryResource
        The resource stack every allocation goes through (read-only: :meth:`set_resource` swaps it).
    spills : Spills or None
        Where responses of spillable arrays are tracked (the manager sets it; None: they are not spilled).
    """

    def __init__(
        self,
        backend: Backend,
        options: Options,
        reclaim_hooks: list[ReclaimHook] | None = None,
        *,
        allocator: Allocator | None = None,
        lease: BrokerLease | None = None,
    ) -> None:
        self.device: Device = backend.device
        self.arrays: ArrayMaker = backend.arrays
        self.resource: MemoryResource = backend.resource
        if allocator is not None and (
            not isinstance(allocator, str) or self._resolved(allocator) != self.resource.name
        ):
            self.resource = make_resource(self.device, allocator)  # beside the backend's: nothing to reset
        self._caps = limiting_adaptors(self.resource)  # a user's LimitingAdaptors: what they leave is free
        self.options = options
        total, limit = self.device.memory_info().total, options.memory_limit
        self.budget = Budget(total if limit is None else min(total, limit))
        self.ledger = Ledger()
        self.history: Recording | None = None
        self.recovery = Recovery([] if reclaim_hooks is None else reclaim_hooks)
        self._listeners: list[Callable[[], None]] = []
        self._free_reading = 0
        self._free_at = -math.inf
        self._free_delta = 0  # VRAM we allocated (+) or released (-) since the reading
        self._generation = 0  # context resets so far (forget_all): a free deferred across one is dropped
        self.spills: Spills | None = None
        on_failure(self.resource, self._library_out_of_memory)
        self.lease = lease
        if lease is not None:
            lease.bind(lambda: self.ledger.live, self._lease_moved)

    def _lease_moved(self) -> None:
        """The lease grew or shrank: read free memory anew, and let waiting batches look again."""
        self._free_at = -math.inf
        self._announce()

    def lease_shortfall(self, nbytes: int) -> int:
        """Bytes the lease lacks for a batch of ``nbytes`` to be offered them whole (0: it has them, or no lease)."""
        lease = self.lease
        if lease is None:
            return 0
        # offered = min((1 - headroom) x free, free - granule): the free bytes that offer nbytes
        need = max(math.ceil(nbytes / (1.0 - self.options.headroom)) + 1, nbytes + self.device.granule)
        return max(0, need - (lease.granted - self.ledger.live))

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each change that may let a batch waiting for memory through.

        Those are: the options, a proportion or pool, a member leaving, and memory released
        (the last only while the policy waits: no batch waits otherwise).
        """
        self._listeners.append(listener)

    def _announce(self) -> None:
        for listener in self._listeners:
            listener()

    def record_to(self, history: Recording | None) -> None:
        """Record plans, allocations, releases and recovery steps to ``history`` (None: stop recording)."""
        self.history = self.recovery.history = history

    def configure(self, **changes: Any) -> Options:
        """Replace the options with ``changes`` applied (validated again); announce and return them."""
        self.options = self.options.replace(**changes)
        self._announce()
        return self.options

    def refuse_in_reclaim(self, call: str) -> None:
        """Raise :class:`ManagerStateError` if reclaim hooks are running (see :meth:`Recovery.refuse_in_reclaim`)."""
        self.recovery.refuse_in_reclaim(call)

    # -- members and groups: the budget's shares, the ledger's keys --------------------------
    def join(self, key: Hashable, proportion: float | None) -> None:
        """Give member ``key`` a share: ``proportion`` (manual pool) or a part of the auto pool.

        Raises
        ------
        BudgetError
            If ``proportion`` is outside (0, 1] or does not fit; nothing changes then.
        """
        self.budget.add(key, proportion)

    def leave(self, key: Hashable) -> int:
        """Member ``key`` left: drop its share, free what it holds, announce; return its peak bytes."""
        self.budget.remove(key)
        self.release_where(lambda a: a.key == key)
        peak = self.ledger.forget(key)  # the id may be reused by a new instance
        if self.spills is not None:
            self.spills.by_key.pop(key, None)
        self._announce()
        return peak

    def set_manual(self, key: Hashable, proportion: float) -> None:
        """Give member ``key`` a manual ``proportion`` (out of the auto pool); announce it."""
        self.budget.set_manual(key, proportion)
        self._announce()

    def move_to_manual(self, key: Hashable, proportion: float, name: str) -> None:
        """Move member ``key`` (called ``name``) from the auto pool to the manual pool.

        Raises
        ------
        BudgetError
            If it has a manual proportion already, or ``proportion`` does not fit.
        """
        if self.budget.is_manual(key):
            raise BudgetError(f"{name} is already in the manual pool: use mgr.budget.set_manual")
        self.budget.set_manual(key, proportion)
        self._announce()

    def set_auto(self, key: Hashable) -> None:
        """Move member ``key`` into the auto pool; announce it."""
        self.budget.set_auto(key)
        self._announce()

    def regroup(self, key: Hashable, old: str, new: str) -> None:
        """Member ``key`` moved from group ``old`` to ``new``: what it holds counts in ``new`` now."""
        if self.history is not None:
            self.history.regrouped(key, old, new, self.ledger.live_by_key.get(key, 0))
        self.ledger.regroup(key, new)

    def forget_group(self, group: str) -> int | None:
        """Group ``group`` is gone: drop its totals and return its peak (None while it still holds arrays)."""
        if self.ledger.live_by_group.get(group):
            return None
        if self.spills is not None:
            self.spills.by_group.pop(group, None)
        return self.ledger.forget_group(group)

    def reset_peaks(
        self, scope: str, *, keys: Collection[Hashable] = (), groups: Collection[str] = (), every: bool = False
    ) -> None:
        """Peaks start again from what is held now: of ``keys`` and ``groups``, or (``every``) all and the total."""
        ledger = self.ledger
        if every:
            ledger.reset_peaks(keys=list(ledger.peak_by_key), groups=list(ledger.peak_by_group), total=True)
        else:
            ledger.reset_peaks(keys=keys, groups=groups)
        if self.history is not None:
            self.history.reset(f"peak stats ({scope})")

    # -- the resource ------------------------------------------------------------------------
    @property
    def resource_name(self) -> str:
        """The name of the resource in use (``"driver"``, ``"cupy"``, ...; ``"default"`` resolved)."""
        return self.resource.name

    def _resolved(self, name: str) -> str:
        return self.device.default_resource if name == "default" else name

    def set_resource(self, allocator: Allocator) -> None:
        """Swap the resource for ``allocator`` (a name, a resource, a factory), through a context reset of the device.

        Every array and stream handed out before is invalid afterwards; the ledger is emptied
        (:meth:`forget_all`). Nothing is reset when the name is refused.

        Raises
        ------
        UnknownAllocatorError
            For a name the device cannot make (see ``Device.create_resource``).
        """
        self.refuse_in_reclaim(f"set_allocator({allocator!r})")
        resource = make_resource(self.device, allocator)  # an unknown or unavailable name: refused before the reset
        self.device.reset()
        self.forget_all()
        on_failure(self.resource, None)
        self.resource = resource
        self._caps = limiting_adaptors(resource)
        on_failure(resource, self._library_out_of_memory)

    def count_library(self, scope: object, key: Hashable, group: str, label: str, nbytes: int) -> None:
        """Member ``key`` (of ``group``) holds ``nbytes`` through a library's pool (``scope``): count them as its own.

        Entered in the ledger as one device allocation of ``label`` with no block (the library
        owns the memory), replacing what ``scope`` counted before: the member's live bytes, its
        group's, the peaks and, in active mode, the headroom of its next batches include them.
        """
        history, old = self.history, self.ledger.pop_owner(scope)
        if history is not None and old:
            history.released(old)
        if nbytes:
            counted = [Allocation(None, label, key, group, MemoryKind.DEVICE, nbytes, None)]
            self.ledger.add(scope, counted, nbytes)
            if history is not None:
                history.allocated([counted], None)
        self._free_delta += nbytes - sum(a.vram for a in old)  # the library took (or gave back) that much

    def _library_out_of_memory(self, nbytes: int) -> bool:
        """The resource's failure handler: another library found no room (see :meth:`Recovery.for_library`)."""
        return self.recovery.for_library(nbytes, self.resource, self.budget.total)

    # -- what there is -----------------------------------------------------------------------
    def memory_info(self) -> MemoryInfo:
        """The device's memory now, the blocks the resource caches counted as free (they serve requests).

        A :class:`~aiocubie.mr.LimitingAdaptor` in the stack bounds it: what the adaptor leaves is
        free, its limit the total (so plans fit it, instead of failing at the allocation).

        Under a ``memory_limit``: a device of that many bytes, of which the pool's bytes in use
        (every library's, where the pool says them; else this manager's own) and this manager's
        managed memory (never pool memory) are taken.
        """
        info, pool, limit = self.device.memory_info(), self.resource.pool_facts(), self.options.memory_limit
        free, total = info.free + (pool.cached or 0), info.total
        for cap in self._caps:  # a LimitingAdaptor in the stack: plans fit what it leaves, not the device
            free, total = min(free, max(0, cap.limit - cap.held)), min(total, cap.limit)
        if self.lease is not None:  # the broker's lease: plans fit what it leaves
            free = min(free, max(0, self.lease.granted - self.ledger.live))
        if limit is None:
            return MemoryInfo(free=free, total=total)
        ledger = self.ledger
        used = max(pool.in_use or 0, ledger.bytes_of(MemoryKind.DEVICE)) + ledger.bytes_of(MemoryKind.MANAGED)
        return MemoryInfo(free=max(0, min(free, limit - used)), total=min(total, limit))

    def other_bytes(self, in_use: int | None) -> int | None:
        """Bytes of the pool's ``in_use`` that this manager does not hold (other libraries'); None if unknown."""
        if in_use is None:
            return None
        return max(0, in_use - self.ledger.bytes_of(MemoryKind.DEVICE))

    def free_memory(self, *, fresh: bool) -> int:
        """Free device memory (cached pool blocks included): a reading at most ``free_cache_seconds`` old, or a new one.

        A cached reading is corrected by what this account allocated and freed since.
        """
        now = time.monotonic()
        if fresh or now - self._free_at > self.options.free_cache_seconds:
            self._free_reading = self.memory_info().free
            self._free_at, self._free_delta = now, 0
        return self._free_reading - self._free_delta

    def available(
        self,
        members: Collection[Hashable],
        free: int,
        *,
        as_if_empty: bool = False,
        group: str = "?",
        warn: bool = False,
    ) -> int:
        """Bytes a group of ``members`` may use under the mode (see :func:`group_available`).

        ``as_if_empty``: as if its members held nothing.
        """
        if not self.options.active:  # passive: caps and holdings do not matter
            return max(0, free)
        return group_available(
            self.options.mode,
            free=free,
            group_cap=self.budget.group_cap(members),
            group_held=0 if as_if_empty else self.ledger.held(members),
            group=group,
            warn=warn,
        )

    def offered(self, members: Collection[Hashable], free: int, *, as_if_empty: bool = False) -> int:
        """Bytes the next batch of a group of ``members`` may take (see :func:`offered_bytes`).

        ``as_if_empty``: what it would be offered if its members held nothing (what a batch
        waiting for memory waits for); in passive mode, if this manager held nothing (every
        group draws from the same free memory).
        """
        options = self.options
        if not options.active:  # passive: what is free
            if as_if_empty:
                free += self.ledger.live
            available = free
        elif as_if_empty:
            free += self.ledger.held(members)  # what they hold would be free
            available = self.available(members, free, as_if_empty=True)
        else:  # read on every batch: group_available() (active, no warning) inline
            available = max(0, min(self.budget.group_cap(members) - self.ledger.held(members), free))
        return offered_bytes(available, free, headroom=options.headroom, granule=self.device.granule)

    # -- allocation and release --------------------------------------------------------------
    def allocate(
        self,
        entries: Sequence[tuple[Hashable, RequestSet]],
        group: str,
        plan: ChunkPlan,
        stream: StreamLike,
        copy_streams: Callable[[], tuple[StreamLike, StreamLike]] | None = None,
    ) -> tuple[list[ArrayResponse], Event]:
        """Allocate every array of a batch with ``plan``'s shapes, then record an event.

        All or nothing: if anything fails, what was allocated is freed before the error
        propagates. Out of memory, it frees the pool's cached blocks and tries again, then
        calls the reclaim hooks and tries again, then raises :class:`OutOfMemoryError` saying
        what each group holds. Returns one response per entry (entered in the ledger) and the
        event recorded after the last allocation and zero fill; each response hands its walks the
        group's ``copy_streams``. Refused (ManagerStateError) while
        reclaim hooks run: a hook that allocates would enter the recovery again.
        """
        if self.recovery.reclaiming is not None:
            self.refuse_in_reclaim("allocating")
        history, debug = self.history, log.isEnabledFor(logging.DEBUG)
        if history is not None:
            history.plan(group, plan, len(entries))
        if debug:
            log.debug(
                "group %r: plan for %d request(s) of %d runs: %d chunk(s) of %d runs, %d bytes of %d offered",
                group,
                len(entries),
                plan.runs,
                plan.chunks,
                plan.chunk_length,
                plan.planned_bytes,
                plan.offered,
            )
        try:
            batch, totals, event = self._allocate(entries, group, plan, stream)
        except OutOfMemoryError as exc:
            batch, totals, event = self.recovery.for_batch(
                functools.partial(self._allocate, entries, group, plan, stream),
                self.resource,
                exc,
                group=group,
                asked=plan.planned_bytes,
                batch=f"{len(entries)} request(s), {plan.chunks} chunk(s) of {plan.chunk_length} runs",
                cap=self.budget.total,
                held=self._held,
            )
        if len(entries) == 1:  # a batch of one request: a stream's every batch
            responses = [self.respond(entries[0][1], batch[0], plan, stream, totals[0], event, copy_streams)]
        else:
            responses = [
                self.respond(requests, allocs, plan, stream, vram, event, copy_streams)
                for (_, requests), allocs, vram in zip(entries, batch, totals)
            ]
        if history is not None:
            history.allocated(batch, plan)
        if debug:
            log.debug("group %r: allocated %d array(s), %d bytes", group, sum(map(len, batch)), sum(totals))
        return responses, event

    def _allocate(
        self, entries: Sequence[tuple[Hashable, RequestSet]], group: str, plan: ChunkPlan, stream: StreamLike
    ) -> tuple[list[list[Allocation]], list[int], Event]:
        """One try at the batch: its allocations per entry, their VRAM bytes, the event; all or nothing."""
        device, resource, make = self.device, self.resource, self.arrays.make
        batch: list[list[Allocation]] = []
        totals: list[int] = []
        chunk_length = plan.chunk_length
        try:
            for key, requests in entries:
                allocs: list[Allocation] = []
                batch.append(allocs)  # before allocating: a failure frees what this entry has too
                vram = 0
                whole = chunk_length >= requests.runs
                for label, request in requests.arrays.items():
                    if whole:
                        shape, size, copies = request.shape, request.nbytes, 1
                    else:
                        shape = request.chunked_shape(chunk_length)
                        size = math.prod(shape) * request.dtype.itemsize
                        copies = min(request.buffers, plan.chunks)  # a walk's chunk buffers
                    nbytes = size if request.uses_vram else 0
                    for _ in range(copies):
                        block = resource.allocate(size, request.kind, stream)
                        try:
                            array = make(block, shape, request.dtype, stream)
                        except BaseException:
                            resource.deallocate(block)
                            raise
                        allocs.append(Allocation(array, label, key, group, request.kind, nbytes, block))
                        vram += nbytes
                        if request.zero:
                            device.zero(array, stream)
                totals.append(vram)
            event = device.record_event(stream)
        except BaseException:
            for allocs in batch:
                for alloc in allocs:
                    resource.deallocate(alloc.block)
            raise
        return batch, totals, event

    def _held(self) -> str:
        """What is held where, for an out-of-memory error."""
        held = ", ".join(
            f"{name!r} {format_bytes(live)}" for name, live in sorted(self.ledger.live_by_group.items()) if live
        )
        info, pool = self.memory_info(), self.resource.pool_facts()
        return (
            f"Held through this manager: {held or 'nothing'}; device: {format_bytes(info.free)} free of "
            f"{format_bytes(info.total)}; pool: {format_bytes(pool.held)} held, {format_bytes(pool.in_use)} in use"
        )

    def respond(
        self,
        requests: RequestSet,
        allocations: list[Allocation],
        plan: ChunkPlan,
        stream: StreamLike,
        vram: int = 0,
        ready: Event | None = None,
        copy_streams: Callable[[], tuple[Any, Any]] | None = None,
    ) -> ArrayResponse:
        """The response for ``allocations`` (``vram`` bytes together, usable once the device
        reaches ``ready``; its walks overlap on the group's ``copy_streams``), entered in the ledger."""
        arrays: dict[str, Any] = {}
        buffers: dict[str, tuple[Any, ...]] = {}
        for a in allocations:
            if a.label not in arrays:
                arrays[a.label] = a.array
            else:  # the chunk buffers of a label: arrays[label] is the first
                buffers[a.label] = (*buffers.get(a.label, (arrays[a.label],)), a.array)
        chunk_length = plan.chunk_length
        # copies: a RequestSet is shared by the requests made from one dict (RequestEntry)
        if chunk_length >= requests.runs:  # whole: the arrays have their full shapes
            shapes, stand_ins = dict(requests.shapes), requests.stand_ins() if arrays else None
        else:
            shapes, stand_ins = requests.chunked_shapes(chunk_length), None
        response = ArrayResponse(  # positional: a call with keywords costs more, and this runs every request
            arrays,
            plan.chunks,
            chunk_length,
            plan.runs,
            shapes,
            dict(requests.chunk_axes),
            stream,
            buffers,
            self.device,
            ready,
            Lease(arrays, buffers, self, stand_ins),
            copy_streams,
        )
        if allocations:
            self.ledger.add(response, allocations, vram)
            self._free_delta += vram
            if requests.spillable and self.spills is not None:
                self.spills.track(response, allocations, requests.spillable)
        return response

    def evict(self, allocations: list[Allocation]) -> int:
        """``allocations`` (held) were copied to host: their bytes leave the ledger's totals, their blocks go
        back now (the copies are done) and waiting batches hear of it; the bytes freed."""
        blocks = [alloc.block for alloc in allocations]
        if self.history is not None:  # a release of their bytes to host (a restore is an allocation)
            self.history.released(allocations, "spill")
        vram = self.ledger.evict(allocations)
        deallocate = self.resource.deallocate
        for block in blocks:
            deallocate(block)
        self._free_delta -= vram
        self._announce()
        return vram

    def graft(self, source: ArrayResponse, owner: ArrayResponse, labels: dict[str, str]) -> list[Allocation] | None:
        """Move the arrays ``source`` was allocated (a restore's request) to ``owner``, relabelled by ``labels``
        (see :meth:`Ledger.graft`); None if either was released."""
        moved = self.ledger.graft(source, owner, labels)
        if moved and self.history is not None:
            self.history.restored(moved[0].group, sum(a.vram for a in moved), ", ".join(sorted({*labels.values()})))
        return moved

    def release(self, response: ArrayResponse | None) -> bool:
        """Free the arrays of ``response`` (nothing if it holds none, or was released).

        Returns True if the ledger held them (False: this account did not hand them out, or they
        were released already).
        """
        if response is None:
            return False
        allocations = self.ledger.pop_owner(response)
        if not allocations:
            return False
        if self.history is not None:
            self.history.released(allocations)
        # :meth:`free` for one response's allocations (every one has a block), on the release of
        # each batch of a stream: its blocks go back once the walks over it have ended
        lease = response.lease
        if not lease.walks:
            self._give_back(allocations, self._generation)
        else:
            lease.after_walks(functools.partial(self._give_back, allocations, self._generation))
        return True

    def release_where(self, predicate: Callable[[Allocation], bool]) -> list[Allocation]:
        """Free every allocation for which ``predicate`` is true; return them."""
        allocations = self.ledger.pop_where(predicate)
        self.free(allocations)
        return allocations

    def free(self, allocations: list[Allocation]) -> None:
        """Give the blocks of ``allocations`` (already out of the ledger) back to the resource.

        Arrays the caller still holds keep their memory alive (see ``Block``); the account
        drops its references.
        """
        if not allocations:
            return
        if self.history is not None:
            self.history.released(allocations)
        owners: dict[int, tuple[Lease, list[Allocation]]] = {}
        now: list[Allocation] = []
        for alloc in allocations:
            if alloc.block is None:  # a library's bytes (count_library): still the library's, nothing to free
                continue
            owner = alloc.owner
            if isinstance(owner, ArrayResponse) and owner.lease.walks:
                owners.setdefault(id(owner), (owner.lease, []))[1].append(alloc)
            else:
                now.append(alloc)
        self._give_back(now, self._generation)
        # a walk over a response queues its next chunks' copies ahead on its copy streams: its
        # blocks go back once every walk over it has ended (a released walk ends at its next
        # chunk, after waiting for its copies)
        for lease, allocs in owners.values():
            lease.after_walks(functools.partial(self._give_back, allocs, self._generation))

    def _give_back(self, allocations: list[Allocation], generation: int) -> None:
        """Deallocate the blocks of ``allocations``, unless a context reset (``generation``) lost them."""
        if not allocations or generation != self._generation:
            return
        deallocate, spilled = self.resource.deallocate, SPILLED
        vram = 0
        try:
            for alloc in allocations:
                if alloc.block is not spilled:  # on host: its bytes left when it was spilled
                    deallocate(alloc.block)
                vram += alloc.vram
        finally:
            self._free_delta -= vram
        if self.lease is not None:
            self.lease.released()
        if self.options.waits:  # only a batch waiting for memory cares: spare waking every group
            self._announce()

    def forget_all(self) -> None:
        """The context that held every array is gone: empty the ledger, read the device anew."""
        if self.history is not None:
            self.history.reset("every array forgotten", context=True)
        self.ledger.pop_where(lambda a: True)
        self._generation += 1  # frees still waiting for a walk to end: their blocks went with the context
        self._free_delta = 0
        self._free_at = -math.inf
