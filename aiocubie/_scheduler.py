"""The per-group scheduler: collect requests into batches, plan, allocate, resolve.

One :class:`GroupScheduler` task per stream group, owned by the manager's task group. A batch
closes when the batch window has passed since its first request, when every member of the
group has asked, or on :meth:`GroupScheduler.flush`. The batch gets one chunk plan, is
allocated on the group's stream (all or nothing), and its requests resolve when the event
recorded after the allocation completes: the completion bridge calls back into the loop
thread, which resolves the group's completed batches in stream order. The group goes on to its
next batch while the device works, and groups never wait on each other.
"""

from __future__ import annotations

import contextvars
import copy
import enum
import inspect
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from ._backends import Backend, Event
from ._completion import thread_safe_caller
from ._errors import AiocubieError, AllocationError, BackendError, InsufficientMemoryError
from ._ledger import Allocation
from ._planner import ChunkPlan, plan_batch
from ._requests import ArrayRequest, ArrayResponse

if TYPE_CHECKING:
    from ._manager import MemoryManager

__all__ = ["GroupScheduler", "Policy", "Ticket", "allocate_batch"]

log = logging.getLogger("aiocubie")


class Policy(str, enum.Enum):
    """What an active-mode batch does when it does not fit the group's headroom now.

    ``chunk``: plan against the headroom there is (more, smaller chunks).
    ``wait``: wait, first come first served, until enough memory is released for the plan the
    batch would get if the group held nothing.
    ``fail``: raise :class:`InsufficientMemoryError` unless the batch fits whole.
    """

    CHUNK = "chunk"
    WAIT = "wait"
    FAIL = "fail"


class State(enum.Enum):
    PENDING = "pending"  # queued or being planned
    ALLOCATED = "allocated"  # arrays exist; waiting for the device
    READY = "ready"
    FAILED = "failed"
    CANCELLED = "cancelled"


_ticket_ids = itertools.count()


@attrs.define(eq=False)
class _Flight:
    """A batch allocated and sent to the device, waiting for its event."""

    tickets: list[Ticket]
    plan: ChunkPlan
    event: Event
    stream: Any
    recorded: float
    done: bool = False  # the device reached the event


@attrs.define(eq=False)
class Ticket:
    """One ``await mgr.request(...)`` on its way through a group's scheduler."""

    key: int
    group: str
    requests: dict[str, ArrayRequest]
    runs: int = 0  # the run length its chunkable arrays share (0: none)
    leftover: bool = False  # queued when a batch closed without it (cut by size or run length)
    enqueued: float = attrs.field(factory=time.perf_counter)
    done: anyio.Event = attrs.field(factory=anyio.Event)
    state: State = State.PENDING
    response: ArrayResponse | None = None
    error: BaseException | None = None
    id: int = attrs.field(factory=lambda: next(_ticket_ids))

    def fail(self, error: BaseException) -> None:
        """End the ticket with ``error`` (a copy: each awaiting task raises its own)."""
        if self.state in (State.PENDING, State.ALLOCATED):
            own = copy.copy(error)
            own.__cause__ = error.__cause__
            self.error, self.state = own, State.FAILED
            self.done.set()


class GroupScheduler:
    """Batches, plans, allocates and resolves the requests of one stream group."""

    def __init__(self, manager: MemoryManager, name: str) -> None:
        self.mgr = manager
        self.name = name
        self.queue: deque[Ticket] = deque()
        self._wake = anyio.Event()
        self._changed = anyio.Event()  # memory released or a waiting ticket cancelled
        self._flush = False
        self._inflight: deque[_Flight] = deque()  # allocated batches, in stream order
        self._waiting: list[Ticket] = []  # the batch being planned or waiting for memory

    # -- called by the manager (sync, loop thread) -----------------------------------------
    def submit(self, ticket: Ticket) -> None:
        """Queue ``ticket`` for the next batch."""
        self.queue.append(ticket)
        self._wake.set()

    def flush(self) -> None:
        """Close the batch being collected now, without waiting for the window."""
        if self.queue:  # a flush with nothing queued must not cut the next batch's window short
            self._flush = True
            self._wake.set()

    def changed(self) -> None:
        """Memory was released, a waiting request withdrawn or a member left: re-check the batch."""
        self._changed.set()
        self._wake.set()  # an open batch may now have heard from every member still registered

    def cancel(self, ticket: Ticket) -> None:
        """Withdraw ``ticket`` (its awaiting task was cancelled); free what it holds."""
        if ticket.state is State.PENDING:
            try:
                self.queue.remove(ticket)
            except ValueError:  # already taken into a batch: the planner drops it
                self.changed()
        if ticket.state in (State.PENDING, State.ALLOCATED, State.READY):
            was_ready = ticket.state is State.READY
            ticket.state = State.CANCELLED
            if was_ready:
                # the arrays exist but the caller will never see them
                self.mgr._release_response(ticket.response)
            self.mgr._counters(self.name, ticket.key, "cancellations")

    def pending(self) -> list[Ticket]:
        """Every ticket not yet resolved: queued, being planned or in flight."""
        inflight = [t for flight in self._inflight for t in flight.tickets]
        return [*self.queue, *self._waiting, *inflight]

    def reset(self, error: AiocubieError) -> None:
        """A context reset: fail every in-flight ticket (its arrays are gone) with ``error``.

        Queued and planning tickets stay: they are served on the new context.
        """
        for flight in self._inflight:
            for ticket in flight.tickets:
                ticket.fail(error)
        self._inflight.clear()  # their events' late callbacks find nothing to do
        self.changed()

    def fail_in_flight(self, owners: set[int], error: AiocubieError) -> list[ArrayResponse]:
        """Fail the in-flight tickets whose response (by id) is in ``owners``; return the responses."""
        failed = []
        for flight in self._inflight:
            for ticket in flight.tickets:
                if ticket.state is State.ALLOCATED and id(ticket.response) in owners:
                    ticket.fail(error)
                    if ticket.response is not None:
                        failed.append(ticket.response)
        return failed

    def close(self, error: AiocubieError) -> None:
        """The manager is closing: fail every ticket not yet resolved with ``error``."""
        for ticket in self.pending():
            ticket.fail(error)
        self.queue.clear()
        self._inflight.clear()  # late event callbacks find nothing to resolve, no hook to call

    # -- the scheduler task ----------------------------------------------------------------
    async def run(self) -> None:
        """Collect, plan and allocate batches until cancelled."""
        while True:
            batch = await self._collect()
            try:
                await self._serve(batch)
            except AiocubieError as exc:
                log.info("group %r: batch of %d failed: %s", self.name, len(batch), exc)
                self._fail(batch, exc)
            except Exception as exc:  # a bug or a foreign error: fail the batch, keep serving
                log.exception("group %r: batch of %d failed unexpectedly", self.name, len(batch))
                error = BackendError(f"allocation failed unexpectedly: {exc!r}")
                error.__cause__ = exc
                self._fail(batch, error)
            finally:
                self._waiting = []

    async def _wait(self, which: str) -> None:
        await getattr(self, which).wait()
        setattr(self, which, anyio.Event())

    async def _collect(self) -> list[Ticket]:
        while not self.queue:
            await self._wait("_wake")
        window = self.mgr.options.batch_window
        # requests left over when the last batch was cut had their window: they close at once
        if self._flush or any(t.leftover for t in self.queue):
            window = 0
        if window > 0 and not self._everyone_asked():  # no timeout scope if it can close now
            # the window runs from the batch's first request, which may have queued behind the last batch
            with anyio.move_on_after(self.queue[0].enqueued + window - time.perf_counter()):
                while not (self._flush or self._everyone_asked()):
                    await self._wait("_wake")
        self._flush = False
        limit = self.mgr.options.max_batch or len(self.queue)
        batch: list[Ticket] = []
        runs = 0
        while self.queue and len(batch) < limit:
            # one plan walks one run axis: a request of another length starts the next batch
            head = self.queue[0]
            if head.runs and runs and head.runs != runs:
                break
            runs = runs or head.runs
            batch.append(self.queue.popleft())
        for ticket in self.queue:
            ticket.leftover = True
        self._waiting = batch
        return batch

    def _everyone_asked(self) -> bool:
        asked = {ticket.key for ticket in self.queue}
        return self.mgr._members_of(self.name) <= asked

    def _live(self, batch: list[Ticket]) -> list[Ticket]:
        return [t for t in batch if t.state is State.PENDING]

    async def _serve(self, batch: list[Ticket]) -> None:
        for attempt in range(2):
            plan = await self._plan(batch)
            batch = self._live(batch)
            if plan is None or not batch:
                return
            stream = self.mgr._stream_of_group(self.name)
            cached = self.mgr._free_memory(fresh=False)
            try:
                entries = [(t.key, t.requests) for t in batch]
                allocations, event = allocate_batch(self.mgr.backend, self.name, entries, plan, stream)
                break
            except AllocationError:
                # planned on a cached reading while another process took memory: plan again, once
                if attempt or self.mgr._free_memory(fresh=True) >= cached:
                    raise
        assert plan is not None  # the loop leaves only through a successful allocation
        now = time.perf_counter()
        for ticket, allocs in zip(batch, allocations):
            ticket.response = self.mgr._respond(ticket.requests, allocs, plan, stream)
            ticket.state = State.ALLOCATED
        flight = _Flight(batch, plan, event, stream, now)
        self._inflight.append(flight)
        try:
            if event.query():
                self._completed(flight)
            else:
                # the callback runs in this task's context, where anyio knows its loop (async
                # hooks are spawned from it)
                call_soon, context = thread_safe_caller(), contextvars.copy_context()
                event.add_done_callback(lambda: _call_soon(call_soon, context.run, self._completed, flight))
        except BaseException:  # the batch never resolves: take it back and free what it holds
            if flight in self._inflight:
                self._inflight.remove(flight)
            for ticket in batch:
                self.mgr._release_response(ticket.response)
            raise
        for ticket in batch:
            self.mgr._record_wait(self.name, ticket.key, now - ticket.enqueued)
        self.mgr._record_batch(self.name, plan, {t.key for t in batch})

    async def _plan(self, batch: list[Ticket]) -> ChunkPlan | None:
        """One plan for the live tickets of ``batch``; under the wait policy, wait for room."""
        mgr = self.mgr
        while batch := self._live(batch):
            requests = {t.id: t.requests for t in batch}
            plan, offered, free = self._plan_against(requests, fresh=False)
            # About to chunk or fail, or to take over half of what the cached reading says is
            # free (where another process's allocation since would bite): read the device again.
            if plan is None or plan.chunks > 1 or 2 * plan.planned_bytes > free:
                plan, offered, free = self._plan_against(requests, fresh=True)
            if mgr.policy is Policy.CHUNK or not mgr.active:
                return plan or plan_batch(requests, offered, free=free)
            if plan is not None and plan.chunks == 1:
                return plan
            if mgr.policy is Policy.FAIL:
                full = sum(r.nbytes for reqs in requests.values() for r in reqs.values() if r.kind.uses_vram)
                raise InsufficientMemoryError(
                    f"policy 'fail': the batch needs {full} bytes whole but group {self.name!r} "
                    f"is offered {offered}; release memory, or use policy 'chunk' or 'wait'"
                )
            best = plan_batch(requests, mgr._offered(self.name, free, as_if_empty=True))
            if plan is not None and plan.planned_bytes >= best.planned_bytes:
                return plan
            # not enough room yet: wait for a release (or re-read the device now and then)
            with anyio.move_on_after(0.05):
                await self._wait("_changed")
        return None

    def _plan_against(
        self, requests: dict[int, dict[str, ArrayRequest]], *, fresh: bool
    ) -> tuple[ChunkPlan | None, int, int]:
        free = self.mgr._free_memory(fresh=fresh)
        offered = self.mgr._offered(self.name, free)
        try:
            return plan_batch(requests, offered, free=free), offered, free
        except InsufficientMemoryError:
            return None, offered, free

    def _completed(self, flight: _Flight) -> None:
        """The device reached ``flight``'s event: resolve every completed batch at the head.

        Runs as a plain callback in the loop thread (no task per batch), and resolves in
        stream order, so a group's batches resolve first in, first out.
        """
        flight.done = True
        try:
            while self._inflight and self._inflight[0].done:
                self._finish(self._inflight.popleft())
        except Exception:  # a loop callback must not raise: trio would crash the whole run
            log.exception("group %r: resolving a batch failed", self.name)

    def _finish(self, flight: _Flight) -> None:
        now = time.perf_counter()
        for ticket in flight.tickets:
            if ticket.state is State.ALLOCATED:
                ticket.state = State.READY
                self.mgr._record_ready(self.name, ticket.key, now - flight.recorded)
                ticket.done.set()
            elif ticket.state is State.CANCELLED:
                self.mgr._release_response(ticket.response)
        self._run_hooks(flight)

    def _run_hooks(self, flight: _Flight) -> None:
        """Call the ready hooks: members with nothing in the batch get the plan with no arrays.

        Async hooks run as tasks of the manager, so a slow hook never holds up resolution.
        """
        served: list[tuple[int, ArrayResponse]] = [
            (t.key, t.response) for t in flight.tickets if t.state is State.READY and t.response
        ]
        asked = {key for key, _ in served}
        for key in self.mgr._members_of(self.name) - asked:
            if self.mgr._ready_hook(key) is not None:
                served.append((key, self.mgr._respond({}, [], flight.plan, flight.stream)))
        for key, response in served:
            hook = self.mgr._ready_hook(key)
            if hook is None:
                continue
            if inspect.iscoroutinefunction(hook):
                # called inside its task: a task cancelled before it starts leaves no coroutine
                # behind that was never awaited
                self.mgr._spawn(self._call_hook, hook, response, key)
                continue
            try:
                hook(response)
            except Exception:
                log.exception("allocation-ready hook of %s raised; the scheduler goes on", self.mgr._name(key))

    async def _call_hook(self, hook: Callable[[ArrayResponse], Awaitable[Any]], response: ArrayResponse, key: int) -> None:
        try:
            await hook(response)
        except Exception:
            log.exception("allocation-ready hook of %s raised; the scheduler goes on", self.mgr._name(key))

    def _fail(self, batch: list[Ticket], error: AiocubieError) -> None:
        for ticket in batch:
            if ticket.state is State.PENDING:
                self.mgr._counters(self.name, ticket.key, "failures")
            ticket.fail(error)


def allocate_batch(
    backend: Backend,
    group: str,
    entries: Sequence[tuple[Hashable, dict[str, ArrayRequest]]],
    plan: ChunkPlan,
    stream: Any,
) -> tuple[list[list[Allocation]], Event]:
    """Allocate every array of a batch with ``plan``'s shapes, then record an event; all or nothing.

    Returns one list of allocations per entry, and the event after the last allocation (and
    zero fill). If anything fails, what was allocated is freed before the error propagates.
    """
    allocations: list[list[Allocation]] = []
    try:
        for key, requests in entries:
            allocs: list[Allocation] = []
            allocations.append(allocs)
            for label, request in requests.items():
                shape = request.chunked_shape(plan.chunk_length)
                array = backend.allocate(shape, request.dtype, request.kind, stream)
                vram = backend.nbytes(array) if request.kind.uses_vram else 0
                allocs.append(Allocation(array, label, key, group, request.kind, vram))
                if request.zero:
                    backend.zero(array, stream)
        event = backend.record_event(stream)
    except BaseException:
        for allocs in allocations:
            for alloc in allocs:
                backend.free(alloc.array)
        raise
    return allocations, event


def _call_soon(call_soon: Callable[..., object], *args: Any) -> None:
    try:
        call_soon(*args)
    except RuntimeError:  # the loop has closed: nobody is left waiting
        pass
