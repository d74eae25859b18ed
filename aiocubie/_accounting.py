"""The device account: the resource stack, the budget, the ledger and the free-memory reading, together.

It alone allocates and frees (through its memory resource, arrays made by the backend's array
maker) for the manager and the schedulers, owns and swaps the resource (``set_resource``), keeps
the ledger in step with the device, says how many bytes a group is offered, and recovers from
out-of-memory (cached blocks, then reclaim hooks). It is the only writer of the resource stack,
the ledger and the budget: members join, leave, move and change pools through it. It knows nothing
of tickets, tasks, the event loop or the manager: hooks and the history recorder are handed to it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import numbers
import threading
import time
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

import attrs

from ._backends import ArrayMaker, Backend, Device, Event, MemoryInfo, MemoryResource
from ._backends._allocators import Allocator, make_resource
from ._backends._resource import on_failure, require_shared_pool
from ._budget import Budget, group_available
from ._errors import BudgetError, ConfigurationError, ManagerStateError, OutOfMemoryError
from ._history import HistoryRecorder
from ._ledger import Allocation, Ledger
from ._options import Options
from ._planner import ChunkPlan, offered_bytes
from ._requests import ArrayResponse, MemoryKind, RequestSet
from ._stats import RecoveryStats, format_bytes

__all__ = ["DeviceAccount", "ReclaimHook"]

log = logging.getLogger("aiocubie")

#: A reclaim hook: called with the bytes an allocation needs, it frees what it can (releases
#: arrays, spills) and returns the bytes it freed, or None if it cannot say. It may release
#: (``release``, ``free``, ``free_all``, ``unregister``, ``change_stream_group``); it may not
#: allocate or reset the context (see :meth:`DeviceAccount.refuse_in_reclaim`).
ReclaimHook = Callable[[int], "int | None"]

#: What a reclaim hook may call, named in the refusal of anything else.
RECLAIM_MAY = "mgr.release, mgr.free, mgr.free_all, mgr.unregister and mgr.change_stream_group"


class DeviceAccount:
    """Memory of one device as a manager sees it.

    Parameters
    ----------
    backend : Backend
        The device, the resource to start with and the array maker.
    options : Options
        The manager's options, held here once: read for the mode, the headroom and how long a
        free-memory reading is reused (and by the schedulers); changed with :meth:`configure`.
    on_release : callable
        Called with no argument after memory is released while batches may wait for it
        (policy wait).
    reclaim_hooks : list of callable, optional
        Called in order when an allocation is out of memory even after the pool's cached
        blocks were released (see :data:`ReclaimHook`); read live.
    allocator : str, MemoryResource or callable, optional
        A resource other than the backend's: a registered name, a resource made on the backend's
        device, or a factory called with the device (None: the backend's resource).

    Attributes
    ----------
    history : HistoryRecorder or None
        Where plans, allocations, releases and recovery steps are recorded (None: nowhere).
    recovery : RecoveryStats
        The out-of-memory recovery steps taken so far.
    device : Device
        The device (streams, events, copies, memory readings).
    arrays : ArrayMaker
        Makes the arrays over the resource's blocks.
    resource : MemoryResource
        The resource stack every allocation goes through (read-only: :meth:`set_resource` swaps it).
    """

    def __init__(
        self,
        backend: Backend,
        options: Options,
        on_release: Callable[[], None],
        reclaim_hooks: list[ReclaimHook] | None = None,
        *,
        allocator: Allocator | None = None,
    ) -> None:
        self.device: Device = backend.device
        self.arrays: ArrayMaker = backend.arrays
        self.resource: MemoryResource = backend.resource
        if allocator is not None and (
            not isinstance(allocator, str) or self._resolved(allocator) != self.resource.name
        ):
            self.resource = make_resource(self.device, allocator)  # beside the backend's: nothing to reset
        self.options = options
        total, limit = self.device.memory_info().total, options.memory_limit
        self.budget = Budget(total if limit is None else min(total, limit))
        self.ledger = Ledger()
        self.history: HistoryRecorder | None = None
        self.reclaim_hooks = [] if reclaim_hooks is None else reclaim_hooks
        self.recovery = RecoveryStats()
        self._on_release = on_release
        self._free_reading = 0
        self._free_at = -math.inf
        self._free_delta = 0  # VRAM we allocated (+) or released (-) since the reading
        self._generation = 0  # context resets so far (forget_all): a free deferred across one is dropped
        self._reclaiming: str | None = None  # while reclaim hooks run: the allocation they run for
        self._refusal: ManagerStateError | None = None  # the last refusal raised inside a hook
        self._thread = threading.get_ident()  # where hooks may run for other libraries' failures
        on_failure(self.resource, self.reclaim_for_library)

    def configure(self, **changes: Any) -> Options:
        """Replace the options with ``changes`` applied (validated again); return them."""
        self.options = self.options.replace(**changes)
        return self.options

    def refuse_in_reclaim(self, call: str) -> None:
        """Raise if reclaim hooks are running: ``call`` (``"set_allocator()"``, ...) may not run in one.

        A reclaim hook runs on an allocation's path, between its tries: it may release memory;
        allocating would enter recovery again (and again), and a context reset would pull the
        device and the streams from under the allocation it runs for.

        Raises
        ------
        ManagerStateError
            Naming the call, the allocation the hooks run for and what a hook may call. Not
            caught by the recovery: the batch fails with it (unless the hook catches it).
        """
        if self._reclaiming is None:
            return
        self._refusal = ManagerStateError(
            f"{call} from a reclaim hook: the hook runs because {self._reclaiming}, and may only release "
            f"memory ({RECLAIM_MAY}); it may not allocate or reset the context. Do that after the "
            "request, outside the hook"
        )
        raise self._refusal

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
        """Member ``key`` left: drop its share, free what it holds; return its peak bytes."""
        self.budget.remove(key)
        self.release_where(lambda a: a.key == key)
        return self.ledger.forget(key)  # the id may be reused by a new instance

    def set_manual(self, key: Hashable, proportion: float) -> None:
        """Give member ``key`` a manual ``proportion`` (out of the auto pool)."""
        self.budget.set_manual(key, proportion)

    def move_to_manual(self, key: Hashable, proportion: float, name: str) -> None:
        """Move member ``key`` (called ``name``) from the auto pool to the manual pool.

        Raises
        ------
        BudgetError
            If it has a manual proportion already, or ``proportion`` does not fit.
        """
        if self.budget.is_manual(key):
            raise BudgetError(f"{name} is already in the manual pool: use set_manual_proportion")
        self.budget.set_manual(key, proportion)

    def set_auto(self, key: Hashable) -> None:
        """Move member ``key`` into the auto pool."""
        self.budget.set_auto(key)

    def regroup(self, key: Hashable, old: str, new: str) -> None:
        """Member ``key`` moved from group ``old`` to ``new``: what it holds counts in ``new`` now."""
        if self.history is not None:
            self.history.regrouped(key, old, new, self.ledger.live_by_key.get(key, 0))
        self.ledger.regroup(key, new)

    def forget_group(self, group: str) -> int | None:
        """Group ``group`` is gone: drop its totals and return its peak (None while it still holds arrays)."""
        if self.ledger.live_by_group.get(group):
            return None
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
        on_failure(resource, self.reclaim_for_library)

    def share_pool(self, libraries: Sequence[str], limit: int | None = None) -> None:
        """Make ``libraries`` allocate from the resource's pool, other libraries capped at ``limit`` bytes together.

        Raises
        ------
        ConfigurationError
            For a resource no other library can draw from, a library that cannot be routed, or a
            limit that is not a whole number of bytes > 0 (or a second, different one).
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit <= 0):
            raise ConfigurationError(
                f"limit must be the bytes other libraries may hold together, an int > 0 (e.g. 4 << 30), got {limit!r}"
            )
        what = f"cannot share the {self.resource.name!r} allocator's pool with {', '.join(map(repr, libraries)) or 'nothing'}"
        require_shared_pool(self.resource, what).share_with(libraries, None if limit is None else int(limit))

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

    def reclaim_for_library(self, nbytes: int) -> bool:
        """Another library's allocation of ``nbytes`` found no room in the shared pool: run the recovery.

        Releases the pool's cached blocks and calls the reclaim hooks (as for aiocubie's own
        batches); True when they freed something, so the library's allocation is tried again.
        Runs only in the thread the account was made in (the event loop's) and never inside a
        recovery already running: elsewhere it returns False and the library sees its own
        out-of-memory error.
        """
        if self._reclaiming is not None or threading.get_ident() != self._thread:
            return False
        what = f"another library's allocation of {format_bytes(nbytes)} found no room in the shared pool"
        self._count(out_of_memory=1)
        in_use = self.resource.pool_facts().in_use
        log.warning("%s: freeing the pool's cached blocks and calling the reclaim hooks", what)
        freed = self.resource.release_cached()
        self._count(cache_releases=1, cache_bytes_freed=freed)
        hooks, reclaimed = list(self.reclaim_hooks), 0
        if hooks:
            self._reclaiming = what
            try:
                for hook in hooks:
                    reclaimed += self._call(hook, nbytes, "(other libraries)")
            except ManagerStateError:
                return False
            finally:
                self._reclaiming = self._refusal = None
            self._count(hook_calls=len(hooks), hook_bytes_freed=reclaimed)
        # the library retries while this says True: trust what left the pool, not what hooks say
        # they freed (a hook that says so and frees nothing would have it retry forever)
        after = self.resource.pool_facts().in_use
        if in_use is not None and after is not None:
            reclaimed = in_use - after
        if freed + reclaimed > 0:
            # counted as recovered so that out_of_memory == recovered + failed holds: a retry that
            # finds no room again comes back here as an out-of-memory of its own
            self._count(recovered=1)
            return True
        self._count(failed=1)
        return False

    # -- what there is -----------------------------------------------------------------------
    def memory_info(self) -> MemoryInfo:
        """The device's memory now, the blocks the resource caches counted as free (they serve requests).

        Under a ``memory_limit``: a device of that many bytes, of which the pool's bytes in use
        (every library's, where the pool says them; else this manager's own) and this manager's
        managed memory (never pool memory) are taken.
        """
        info, pool, limit = self.device.memory_info(), self.resource.pool_facts(), self.options.memory_limit
        free = info.free + (pool.cached or 0)
        if limit is None:
            return MemoryInfo(free=free, total=info.total)
        ledger = self.ledger
        used = max(pool.in_use or 0, ledger.bytes_of(MemoryKind.DEVICE)) + ledger.bytes_of(MemoryKind.MANAGED)
        return MemoryInfo(free=max(0, min(free, limit - used)), total=min(info.total, limit))

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
        stream: Any,
    ) -> tuple[list[ArrayResponse], Event]:
        """Allocate every array of a batch with ``plan``'s shapes, then record an event.

        All or nothing: if anything fails, what was allocated is freed before the error
        propagates. Out of memory, it frees the pool's cached blocks and tries again, then
        calls the reclaim hooks and tries again, then raises :class:`OutOfMemoryError` saying
        what each group holds. Returns one response per entry (entered in the ledger) and the
        event recorded after the last allocation and zero fill. Refused (ManagerStateError) while
        reclaim hooks run: a hook that allocates would enter the recovery again.
        """
        if self._reclaiming is not None:
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
            batch, totals, event = self._recover(entries, group, plan, stream, exc)
        if len(entries) == 1:  # a batch of one request: a stream's every batch
            responses = [self.respond(entries[0][1], batch[0], plan, stream, totals[0], event)]
        else:
            responses = [
                self.respond(requests, allocs, plan, stream, vram, event)
                for (_, requests), allocs, vram in zip(entries, batch, totals)
            ]
        if history is not None:
            history.allocated(batch, plan)
        if debug:
            log.debug("group %r: allocated %d array(s), %d bytes", group, sum(map(len, batch)), sum(totals))
        return responses, event

    def _allocate(
        self, entries: Sequence[tuple[Hashable, RequestSet]], group: str, plan: ChunkPlan, stream: Any
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

    def _recover(
        self,
        entries: Sequence[tuple[Hashable, RequestSet]],
        group: str,
        plan: ChunkPlan,
        stream: Any,
        error: OutOfMemoryError,
    ) -> tuple[list[list[Allocation]], list[int], Event]:
        """Out of memory: free the pool's cache and retry, call the reclaim hooks and retry, or raise."""
        asked, history = plan.planned_bytes, self.history
        self._count(out_of_memory=1)
        log.warning(
            "group %r: out of memory for %s (%s): freeing the pool's cached blocks", group, format_bytes(asked), error
        )
        freed = self.resource.release_cached()
        self._count(cache_releases=1, cache_bytes_freed=freed)
        if history is not None:
            history.recovery(group, freed, "released the pool's cached blocks")
        try:
            return self._retried(entries, group, plan, stream)
        except OutOfMemoryError as exc:
            error = exc
        hooks = list(self.reclaim_hooks)
        if hooks:
            self._reclaiming = (
                f"group {group!r} is out of memory for {format_bytes(asked)} ({len(entries)} request(s), "
                f"{plan.chunks} chunk(s) of {plan.chunk_length} runs)"
            )
            called = reclaimed = 0
            try:
                for hook in hooks:
                    called += 1
                    reclaimed += self._call(hook, asked, group)
            except ManagerStateError as refused:  # a hook called what it may not: the batch fails with that
                self._count(hook_calls=called, failed=1)
                log.error("group %r: %s", group, refused)
                raise
            finally:
                self._reclaiming = self._refusal = None
            self._count(hook_calls=len(hooks), hook_bytes_freed=reclaimed)
            log.warning("group %r: %d reclaim hook(s) freed %s", group, len(hooks), format_bytes(reclaimed))
            try:
                return self._retried(entries, group, plan, stream)
            except OutOfMemoryError as exc:
                error = exc
        self._count(failed=1)
        held = ", ".join(
            f"{name!r} {format_bytes(live)}" for name, live in sorted(self.ledger.live_by_group.items()) if live
        )
        info, pool = self.memory_info(), self.resource.pool_facts()
        message = (
            f"out of memory: group {group!r} asked for {format_bytes(asked)} ({len(entries)} request(s), "
            f"{plan.chunks} chunk(s) of {plan.chunk_length} runs); releasing {format_bytes(freed)} of cached pool "
            f"blocks and calling {len(hooks)} reclaim hook(s) did not make room. Held through this manager: "
            f"{held or 'nothing'}; device: {format_bytes(info.free)} free of {format_bytes(info.total)}; pool: "
            f"{format_bytes(pool.held)} held, {format_bytes(pool.in_use)} in use. Release arrays (mgr.release, "
            f"mgr.free), ask for fewer runs, or register a reclaim hook that frees or spills "
            f"(mgr.add_reclaim_hook). The device said: {error}"
        )
        log.error("%s", message)
        if history is not None:
            history.failure(group, asked, error)
            if history.dump_on_oom is not None:
                try:
                    history.history().to_json(history.dump_on_oom)
                except OSError as exc:  # the out-of-memory error is what the request must see
                    log.error("could not write the allocation history to %s: %s", history.dump_on_oom, exc)
                else:
                    log.error("allocation history written to %s", history.dump_on_oom)
        raise OutOfMemoryError(message) from error

    def _retried(
        self, entries: Sequence[tuple[Hashable, RequestSet]], group: str, plan: ChunkPlan, stream: Any
    ) -> tuple[list[list[Allocation]], list[int], Event]:
        result = self._allocate(entries, group, plan, stream)
        self._count(recovered=1)
        log.warning("group %r: allocation recovered from out of memory", group)
        return result

    def _call(self, hook: ReclaimHook, nbytes: int, group: str) -> int:
        """Call one reclaim hook; the bytes it says it freed (0 if it failed or cannot say)."""
        try:
            freed = hook(nbytes)
        except Exception as exc:
            if exc is self._refusal:  # it called what a hook may not: not a hook's ordinary failure
                raise
            log.exception("reclaim hook %r raised; going on with the next step", hook)
            return 0
        if inspect.isawaitable(freed):  # not awaited on the allocation path: refuse it loudly
            getattr(freed, "close", lambda: None)()
            log.error("reclaim hook %r returned an awaitable: reclaim hooks must be plain functions", hook)
            return 0
        # what it says it freed: a whole number of bytes (numpy's too), at most the device's total;
        # anything else (None, True, a float, a negative number) counts as "cannot say"
        said = int(freed) if isinstance(freed, numbers.Integral) and not isinstance(freed, bool) else 0
        nbytes = min(said, self.budget.total) if said > 0 else 0
        if self.history is not None:
            self.history.recovery(group, nbytes, f"reclaim hook {getattr(hook, '__qualname__', hook)!r}")
        return nbytes

    def _count(self, **steps: int) -> None:
        self.recovery = attrs.evolve(
            self.recovery, **{name: getattr(self.recovery, name) + n for name, n in steps.items()}
        )

    def respond(
        self,
        requests: RequestSet,
        allocations: list[Allocation],
        plan: ChunkPlan,
        stream: Any,
        vram: int = 0,
        ready: Event | None = None,
    ) -> ArrayResponse:
        """The response for ``allocations`` (``vram`` bytes together, usable once the device
        reaches ``ready``), entered in the ledger."""
        arrays: dict[str, Any] = {}
        buffers: dict[str, tuple[Any, ...]] = {}
        for a in allocations:
            if a.label not in arrays:
                arrays[a.label] = a.array
            else:  # the chunk buffers of a label: arrays[label] is the first
                buffers[a.label] = (*buffers.get(a.label, (arrays[a.label],)), a.array)
        chunk_length = plan.chunk_length
        # copies: a RequestSet is shared by the requests made from one dict (RequestEntry)
        shapes = dict(requests.shapes) if chunk_length >= requests.runs else requests.chunked_shapes(chunk_length)
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
        )
        if allocations:
            self.ledger.add(response, allocations, vram)
            self._free_delta += vram
        return response

    def release(self, response: ArrayResponse | None) -> None:
        """Free the arrays of ``response`` (nothing if it holds none, or was released)."""
        if response is None:
            return
        allocations = self.ledger.pop_owner(response)
        if not allocations:
            return
        if self.history is not None:
            self.history.released(allocations)
        # :meth:`free` for one response's allocations (every one has a block), on the release of
        # each batch of a stream: its blocks go back once the walks over it have ended
        walks = response._walks
        if walks is None or not walks[0]:
            self._give_back(allocations, self._generation)
        else:
            response._after_walks(functools.partial(self._give_back, allocations, self._generation))

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
        owners: dict[int, tuple[ArrayResponse, list[Allocation]]] = {}
        now: list[Allocation] = []
        for alloc in allocations:
            if alloc.block is None:  # a library's bytes (count_library): still the library's, nothing to free
                continue
            owner = alloc.owner
            if isinstance(owner, ArrayResponse) and owner._walks is not None:
                owners.setdefault(id(owner), (owner, []))[1].append(alloc)
            else:
                now.append(alloc)
        self._give_back(now, self._generation)
        # a walk over a response queues its next chunks' copies ahead on its copy streams: its
        # blocks go back once every walk over it has ended (a released walk ends at its next
        # chunk, after waiting for its copies)
        for owner, allocs in owners.values():
            owner._after_walks(functools.partial(self._give_back, allocs, self._generation))

    def _give_back(self, allocations: list[Allocation], generation: int) -> None:
        """Deallocate the blocks of ``allocations``, unless a context reset (``generation``) lost them."""
        if not allocations or generation != self._generation:
            return
        deallocate = self.resource.deallocate
        vram = 0
        try:
            for alloc in allocations:
                deallocate(alloc.block)
                vram += alloc.vram
        finally:
            self._free_delta -= vram
        if self.options.waits:  # only a batch waiting for memory cares: spare waking every group
            self._on_release()

    def forget_all(self) -> None:
        """The context that held every array is gone: empty the ledger, read the device anew."""
        if self.history is not None:
            self.history.reset("every array forgotten", context=True)
        self.ledger.pop_where(lambda a: True)
        self._generation += 1  # frees still waiting for a walk to end: their blocks went with the context
        self._free_delta = 0
        self._free_at = -math.inf
