"""The per-group scheduler: collect requests into batches, plan, allocate, resolve.

One :class:`GroupScheduler` per stream group. It is handed what it needs (the group, the
members, the device account and the options it holds, the loop's primitives, a way to start tasks) and
never reaches the manager. A batch closes when the batch window has passed since its first
request, when every member of the group has asked, or on :meth:`GroupScheduler.flush`. A
request that can close a batch at once (nothing queued or being planned ahead of it, and
every member asked or no window) is served in the caller's task: no task switch; a lone
member's request whose last plan applies, with no ticket at all (:meth:`GroupScheduler.express`). Each batch
gets one chunk plan and goes to the group's :class:`~aiocubie._flights.Flights`, which allocates
it on the group's stream (all or nothing) and resolves its requests when the event recorded after
the allocation completes, in stream order (ordered requests at once: work on the stream runs after
the allocation; the ready hooks still wait).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from ._account import Account
from ._completion import Loop, Signal
from ._errors import AiocubieError, BackendError, OutOfMemoryError, PlanningError, warn
from ._flights import Flights, count
from ._leasing import BatchLease
from ._options import Policy
from ._planner import ChunkPlan, chunk_axis_hint
from ._policy import Totals, Wait, check_under_cap, decide, longest_head, self_wait_warning, waits_on_itself
from ._priority import outranked, ranked, standing
from ._registry import Group, Member
from ._requests import ArrayResponse, RequestSet
from ._spill import spill_room
from ._tickets import State, Ticket
from ._waiting import WaitingLine

__all__ = ["GroupScheduler"]

log = logging.getLogger("aiocubie")

Spawn = Callable[..., object]

_PENDING = State.PENDING  # read in the hot loops (Ticket.pending, without a call)


class GroupScheduler:
    """Batches, plans, allocates and resolves the requests of one stream group.

    Parameters
    ----------
    group : Group
        The group served: its name, stream, members' keys and counters (read live).
    members : mapping
        Every member by key (for ready hooks and names), read live.
    account : Account
        Plans against it, allocates and releases through it; its options (batch window, batch
        size, mode and policy) are read live.
    loop : Loop
        The running loop's primitives (signals, thread-safe calls, checkpoints).
    spawn : callable
        ``spawn(async_fn, *args)`` starts a task that someone owns (async ready hooks).
    line : WaitingLine
        The batches of every group waiting for memory in passive mode under policy wait, first
        come first served: this group's batch joins it when it does not fit, and is served at its head.
    """

    def __init__(
        self,
        group: Group,
        members: Mapping[int, Member],
        account: Account,
        loop: Loop,
        spawn: Spawn,
        line: WaitingLine,
    ) -> None:
        self.group = group
        self.name = group.name
        self._members = members
        self._account = account
        self._loop = loop
        self._spawn = spawn
        self._line = line
        self.queue: deque[Ticket] = deque()
        self._wake = loop.signal()
        self._changed = loop.signal()  # memory released or a waiting ticket withdrawn
        self._flush = False
        self._planning: list[Ticket] = []  # the batch being planned or waiting for memory
        # allocated batches, in stream order (a reclaim hook may take tickets out of the batch planned)
        self.flights = Flights(group, members, account, loop, spawn, lambda: self._planning)
        self._closed = False
        self._scope: anyio.CancelScope | None = None  # the scope of :meth:`run`, once it started
        self._warned: set[int] = set()  # ids of waiting tickets warned that they wait on their own members
        self._mixed = False  # the queue may hold requests of several priorities (see _collect)
        self._short = 0  # bytes the batch being planned lacks, when it asked for room to be made (_plan)
        self._relieved = False  # room was made for the batch being planned: the policy decides now
        # the last one-chunk plan of a batch of one request, and what it was worked out from (_try_plan)
        self._memo: tuple[tuple[Any, ...], ChunkPlan] | None = None
        # what a batch leases from the node broker before it is planned (broker=PATH)
        self._lease = BatchLease(account)
        self._room: Callable[[], Awaitable[int]] | None = None  # spills that may let the batch fit (_plan_to_policy)

    # -- called from the loop thread (sync) ----------------------------------------------------
    def submit(self, ticket: Ticket) -> None:
        """Take ``ticket``: serve it now if it closes a batch at once, else queue it."""
        members = self.group.members
        if (
            self.queue
            or self._planning
            or self._closed
            # unless every member has asked (it is the only one), or batches do not wait
            or not (
                (len(members) <= 1 and (not members or ticket.key in members)) or not self._account.options.batch_window
            )
        ):
            self.queue.append(ticket)
            self._wake.set()
            planning = self._planning
            if ticket.priority != self.queue[0].priority or (planning and planning[0].priority != ticket.priority):
                self._mixed = True  # the next batch is picked by priority (see _collect)
                self._changed.set()  # a batch waiting for memory may have to make way (see _plan)
            return
        # a batch of this ticket alone, served in the caller's task (or queued to wait for memory)
        batch = self._planning = [ticket]
        try:
            for attempt in range(2):
                if ticket.state is not _PENDING:  # ended by a reclaim hook of the last attempt (its member left)
                    return
                plan = self._try_plan(batch)
                # it must wait for memory, or behind a batch of another group that outranks it: the
                # group's task does that (it joins the waiting line)
                if plan is None or (self._line.entries and self._behind()):
                    ticket.leftover = True
                    self.queue.append(ticket)
                    self._wake.set()
                    return
                if self.flights.dispatch(batch, plan, retry=not attempt):
                    return
        except Exception as exc:
            self._failed(batch, exc)
        finally:
            self._planning = []

    def express(self, member: Member, requests: RequestSet, ordered: bool) -> ArrayResponse | Ticket | None:
        """Serve ``member``'s request in the caller's task, with no ticket where none is needed.

        The express path: it applies when nothing is queued, planned or in flight in the group,
        ``member`` is its only member, and the last plan applies (the memo of :meth:`_try_plan`:
        the same request set, free memory, holdings, budget and options). That is what
        :meth:`submit` does for a ticket of one member alone in an idle group, less the ticket, the
        checks and the batch of one (see :meth:`Flights.express`). Returns the response (ready), a
        ticket (in flight, ready for the ready hooks, or failed), or None: the ordinary way.
        """
        last = self._memo
        if last is None or self.queue or self._planning or self._closed or self.flights.queue:
            return None
        key, members, account = member.key, self.group.members, self._account
        if len(members) != 1 or key not in members:
            return None
        # the memo's key (_memo_key), inline: every request of a stream passes here
        memo = (
            requests,
            key,
            account.free_memory(fresh=False),
            account.ledger.live_by_key.get(key, 0),
            account.budget.version,
            account.options,
        )
        if last[0] != memo:
            return None
        start = time.perf_counter()
        try:
            return self.flights.express(member, requests, last[1], ordered, start)
        except Exception as exc:  # nothing allocated: the ticket of a batch of one fails as submit's would
            counters = self.group.counters, member.counters
            count(counters)
            ticket = Ticket(key, requests, counters, ordered, member.priority, member.waits)
            self._failed([ticket], exc)
            return ticket

    def adopt(self, tickets: list[Ticket]) -> None:
        """Queue ``tickets`` moved here from another group, behind what is queued; they are
        counted in this group from now on (their batch, chunks, waits and failures are here)."""
        for ticket in tickets:
            ticket.regroup(self.group.counters)
        if tickets:
            self.queue.extend(tickets)
            self._mixed = self._mixed or len({t.priority for t in self.queue}) > 1
            self._wake.set()

    def take(self, key: int) -> list[Ticket]:
        """Remove and return the open tickets of member ``key`` that have no arrays yet (it
        moves to another group): queued ones, and those of a batch waiting for memory, which
        must be planned against the new group's budget. In-flight ones finish here."""
        taken = [t for t in (*self._planning, *self.queue) if t.key == key and t.pending]
        if taken:
            self.queue = deque(t for t in self.queue if t.key != key)
            self._planning = [t for t in self._planning if t.key != key]
            self._lease.again()
            self.changed()  # a batch waiting for memory may fit without them
        return taken

    def flush(self) -> None:
        """Close the batch being collected now, without waiting for the window."""
        if self.queue:  # a flush with nothing queued must not cut the next batch's window short
            self._flush = True
            self._wake.set()

    def changed(self) -> None:
        """Memory was released, a waiting request withdrawn or a member left: re-check the batch."""
        self._changed.set()
        self._wake.set()  # an open batch may now have heard from every member still registered

    def withdraw(self, ticket: Ticket) -> None:
        """Forget ``ticket`` if it is queued here (it ended elsewhere: cancelled or failed)."""
        try:
            self.queue.remove(ticket)
        except ValueError:
            if ticket in self._planning:  # a batch waiting for memory may fit without it
                self._lease.again()
                self.changed()

    def pending(self) -> list[Ticket]:
        """Every ticket not yet through: queued, being planned, or in flight (cancelled ones too,
        until the device is done with their arrays)."""
        return [t for t in (*self.queue, *self._planning) if t.pending] + self.flights.tickets()

    def census(self) -> tuple[int, int, int, int]:
        """Tickets held now: queued, being planned (or waiting for memory), allocated in flight,
        and ended (cancelled or failed) in flight, their arrays kept until the device is done."""
        flying = self.flights.tickets()
        allocated = sum(t.state is State.ALLOCATED for t in flying)
        queued = sum(t.pending for t in self.queue)
        return queued, sum(t.pending for t in self._planning), allocated, len(flying) - allocated

    @staticmethod
    def fail(tickets: list[Ticket], error: AiocubieError) -> list[ArrayResponse]:
        """End ``tickets`` with ``error``; return the responses whose arrays must be released."""
        return [response for ticket in tickets if (response := ticket.fail(error)) is not None]

    def drop(self, key: int, error: AiocubieError) -> list[ArrayResponse]:
        """End every open ticket of member ``key`` here with ``error`` (it left); return what to release."""
        tickets = [t for t in self.pending() if t.key == key]
        for ticket in tickets:
            self.withdraw(ticket)
        return self.fail(tickets, error)

    def fail_in_flight(self, owners: set[int], error: AiocubieError) -> list[ArrayResponse]:
        """Fail the in-flight tickets whose response (by id) is in ``owners``; return the responses."""
        tickets = [t for t in self.flights.tickets() if not t.done and id(t.response) in owners]
        return self.fail(tickets, error)

    def reset(self, error: AiocubieError) -> None:
        """A context reset: fail every in-flight ticket (its arrays are gone) with ``error``.

        Queued and planning tickets stay: they are served on the new context.
        """
        self.flights.fail(error)
        self.changed()

    def close(self, error: AiocubieError) -> list[ArrayResponse]:
        """The manager is closing: fail every ticket not yet resolved; return what to release."""
        self._closed = True
        held = self.fail(self.pending(), error)
        self.queue.clear()
        self.flights.queue.clear()  # late event callbacks find nothing to resolve, no hook to call
        self.stop()
        return held

    def stop(self) -> None:
        """End :meth:`run` (now, or as soon as it starts). Batches in flight still resolve."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()

    # -- the scheduler's task ------------------------------------------------------------------
    async def run(self) -> None:
        """Collect, plan and allocate batches until cancelled or :meth:`stop` is called."""
        with anyio.CancelScope() as self._scope:
            if self._closed:  # stopped before the task started
                return
            while True:
                try:
                    # no local for the batch: it would hold the last batch's responses, and with
                    # them their memory, for as long as the group stays quiet
                    await self._serve(await self._collect())
                finally:
                    self._planning = []
                    self._warned.clear()
                    self._relieved = False
                    self._lease.reset()

    async def _sleep(self, which: str) -> None:
        signal: Signal = getattr(self, which)
        try:
            await signal
        finally:
            setattr(self, which, self._loop.signal())

    async def _collect(self) -> list[Ticket]:
        while not self._live_queue():
            await self._sleep("_wake")
        window = self._account.options.batch_window
        # requests left over when the last batch was cut had their window: they close at once
        if self._flush or any(t.leftover for t in self.queue):
            window = 0
        if window > 0 and not self._everyone_asked():  # no timeout scope if it can close now
            # the window runs from the batch's first request, which may have queued behind the last batch
            with anyio.move_on_after(self.queue[0].enqueued + window - time.perf_counter()):
                while not (self._flush or self._everyone_asked()):
                    await self._sleep("_wake")
        self._flush = False
        options = self._account.options
        limit = options.max_batch or len(self.queue)
        if self._mixed:  # higher (effective) priority first, first come first served within
            self.queue = deque(ranked(self.queue, time.perf_counter(), options.priority_aging))
            self._mixed = len({t.priority for t in self.queue}) > 1
        batch: list[Ticket] = []
        runs = 0
        while self._live_queue() and len(batch) < limit:
            # one plan walks one run axis: a request of another length starts the next batch
            head = self.queue[0]
            if head.runs > 1 and runs > 1 and head.runs != runs:  # 0 or 1 run agrees with any length
                break
            if batch and head.priority != batch[0].priority:  # one priority a batch: another starts the next
                break
            runs = max(runs, head.runs)
            batch.append(self.queue.popleft())
        for ticket in self.queue:
            ticket.leftover = True
        self._planning = batch
        return batch

    def _live_queue(self) -> bool:
        while self.queue and self.queue[0].state is not _PENDING:  # ended while queued
            self.queue.popleft()
        return bool(self.queue)

    def _everyone_asked(self) -> bool:
        asked = {ticket.key for ticket in self.queue if ticket.state is _PENDING}
        return self.group.members <= asked

    async def _serve(self, batch: list[Ticket]) -> None:
        # self._planning is the batch: a member that moves away takes its tickets out of it
        try:
            attempt = 0
            while attempt < 2:
                try:
                    plan = await self._plan()
                except PlanningError:
                    if self._drop_unplannable():  # the others may fit without them: plan again
                        continue
                    raise
                batch = self._planning = [t for t in self._planning if t.state is _PENDING]
                if plan is None or not batch or self.flights.dispatch(batch, plan, retry=not attempt):
                    return
                attempt += 1
        except Exception as exc:
            self._failed(self._planning, exc)

    def _drop_unplannable(self) -> bool:
        """Make a batch that cannot be planned smaller; True if it changed (plan it again).

        One request too large for the group must not take its batch-mates down with it: the
        tickets that cannot be planned even alone fail, alone. If each fits alone but not all
        together, the batch shrinks to its longest head that can be planned (first in, first
        served) and the rest go back to the front of the queue, to be the next batch.
        """
        live = [t for t in self._planning if t.pending]
        if len(live) < 2:
            return False
        dropped = False
        for ticket in live:
            try:
                self._try_plan([ticket])
            except PlanningError as exc:
                self._failed([ticket], exc)
                dropped = True
        if dropped:
            self._planning = [t for t in self._planning if t.pending]
            return True

        def plannable(count: int) -> bool:
            try:
                self._try_plan(live[:count])
            except PlanningError:
                return False
            return True

        fits = longest_head(len(live), plannable)  # the head alone can be planned (just checked); all cannot
        self._requeue(live[fits:], keep=live[:fits])
        return True

    def _requeue(self, tickets: list[Ticket], keep: list[Ticket]) -> None:
        """``tickets`` of the batch go back to the front of the queue, in order; the batch keeps ``keep``."""
        for ticket in tickets:
            ticket.leftover = True  # they had their window: the next batch closes at once
        self.queue.extendleft(reversed(tickets))
        self._planning = keep
        self._wake.set()

    def _failed(self, batch: list[Ticket], exc: Exception) -> None:
        if isinstance(exc, AiocubieError):
            log.info("group %r: batch of %d failed: %s", self.name, len(batch), exc)
            error = exc
        else:  # a bug or a foreign error: fail the batch, keep serving
            log.exception("group %r: batch of %d failed unexpectedly", self.name, len(batch))
            error = BackendError(f"allocation failed unexpectedly: {exc!r}")
            error.__cause__ = exc
        history = self._account.history
        if history is not None and not isinstance(exc, OutOfMemoryError):  # the account recorded that one
            needed = sum(t.requests.fixed + t.requests.per_run * t.requests.runs for t in batch)
            history.failure(self.name, needed, error)
        for ticket in batch:
            if ticket.pending:
                for counters in ticket.counters:
                    counters.failures += 1
        for response in self.fail(batch, error):
            self._account.release(response)

    # -- planning ------------------------------------------------------------------------------
    async def _plan(self) -> ChunkPlan | None:
        """One plan for the live tickets of the batch; under the wait policy, wait for room.

        In passive mode a batch that waits joins the waiting line of every group, and is served
        only at its head (first come, first served among waiting batches); it leaves the line when
        it ends, however. Two exceptions keep a waiting batch from holding up the releases it waits
        for (a component that holds memory and asks again before releasing it): a batch that fits
        when it is planned never waits behind the line, and a waiting batch whose members hold
        memory is served as soon as it fits (see :meth:`_behind`). The price: steady traffic of
        batches of its priority that fit may serve ahead of a large waiting one.

        Priorities: the line goes by rank (:mod:`aiocubie._priority`), and a batch that waits
        makes way for a request of its group that outranks it (its requests go back to the queue).
        A batch that does not fit whole first awaits the account's ``make_room`` once (the async
        reclaim hooks), then plans again and lets the policy decide.
        """
        self._short = 0
        try:
            while batch := [t for t in self._planning if t.state is _PENDING]:
                plan = self._try_plan(batch)
                if plan is None and self._lease.short is not None:
                    await self._waiting("a lease from the node broker", self._lease.take(batch[0].priority), batch)
                    continue
                if plan is not None and not self._behind():
                    return plan
                room, self._room = self._room, None
                if room is not None:  # spill idle arrays first, then plan again
                    await self._waiting("idle arrays to spill", room(), batch)
                    continue
                options = self._account.options
                if plan is None and self._short:  # it does not fit whole: make room, then plan again
                    short, self._short, self._relieved = self._short, 0, True
                    freed = self._account.recovery.make_room(
                        short, batch[0].priority, self.name, options.reclaim_timeout
                    )
                    await self._waiting("the reclaim hooks", freed, batch)
                    continue
                if self._mixed and outranked(batch, self.queue, time.perf_counter(), options.priority_aging):
                    self._requeue(batch, keep=[])  # it makes way: the next batch is picked by rank
                    if (history := self._account.history) is not None:  # its requests wait in the queue again
                        history.waited(self.name, "made way", time.perf_counter(), batch[0].priority, len(batch))
                    return None
                if options.waits and not options.active:
                    self._line.join(self, *standing(batch))
                # not enough room yet: wait for a release (or re-read the device now and then)
                reason = "a waiting batch of another group" if plan is not None else "memory (policy wait)"
                with anyio.move_on_after(0.05):
                    await self._waiting(reason, self._sleep("_changed"), batch)
            return None
        finally:
            self._line.leave(self)

    async def _waiting(self, reason: str, wait: Awaitable[object], batch: list[Ticket]) -> None:
        """Await ``wait``: the batch waits for ``reason`` (recorded in the history, if one records)."""
        if self._account.history is None:
            await wait
            return
        start = time.perf_counter()
        try:
            await wait
        finally:
            if (history := self._account.history) is not None:  # the one recording now: a stopped one stays as it was
                history.waited(self.name, reason, start, batch[0].priority, len(batch))

    def _behind(self) -> bool:
        """True if this group's batch waits for memory behind another group's (passive, policy wait).

        Behind a waiting batch that goes first (:meth:`WaitingLine.ahead`: for a batch not in
        line, only one of another priority that outranks it). A batch whose members hold memory
        is never behind: the batches ahead may wait for what they hold, which they would release
        only after this batch is served.
        """
        line = self._line
        batch = [t for t in self._planning if t.state is _PENDING]
        if not line.entries or not batch:
            return False
        options = self._account.options
        if options.active or not options.waits:  # the mode or policy changed while it waited
            return False
        if not line.ahead(self, *standing(batch), time.perf_counter(), options.priority_aging):
            return False
        return not self._account.ledger.held({t.key for t in batch})

    def _try_plan(self, batch: list[Ticket]) -> ChunkPlan | None:
        """The plan for ``batch`` now, or None if it must wait for memory (policy wait).

        Raises the planning error when it cannot fit, or (policy fail) not whole.
        """
        single = len(batch) == 1
        if single:
            requests = batch[0].requests
            runs, fixed, per_run, buffered = requests.runs, requests.fixed, requests.per_run, requests.buffered
        else:
            runs = fixed = per_run = buffered = 0
            for ticket in batch:
                requests = ticket.requests
                runs = max(runs, requests.runs)  # 0 or 1 (length-1 run axes) agrees with any length
                fixed += requests.fixed
                per_run += requests.per_run
                buffered += requests.buffered
        account = self._account
        members = self.group.members
        free = account.free_memory(fresh=False)
        memo = None
        if single and len(members) == 1 and batch[0].key in members:
            # a stream's every batch, alone in its group: the plan of the last batch if what it was
            # worked out from is the same (the request set, its member, what is free and held, the
            # budget and the options: the group's offer is a function of these)
            memo = self._memo_key(requests, batch[0].key, free)
            last = self._memo
            if last is not None and last[0] == memo:
                return last[1]
        offered = account.offered(members, free)
        full = fixed + per_run * runs
        if full <= offered and 2 * full <= free:
            # the usual batch: it fits whole in what the group is offered, and takes at most half
            # of what the cached reading says is free: the plan of one chunk, whatever the policy
            # (what plan_chunks and the checks below give it, without them)
            whole = ChunkPlan(runs, 1, runs, offered, full, full)
            if memo is not None:
                self._memo = (memo, whole)
            return whole
        return self._plan_to_policy(batch, Totals(runs, fixed, per_run, buffered))

    def _memo_key(self, requests: RequestSet, key: int, free: int) -> tuple[Any, ...]:
        """What the plan of a batch of ``key``'s ``requests`` alone in its group is worked out from
        (the group's offer is a function of these): the plan memo's key."""
        account = self._account
        return (requests, key, free, account.ledger.live_by_key.get(key, 0), account.budget.version, account.options)

    def _plan_to_policy(self, batch: list[Ticket], totals: Totals) -> ChunkPlan | None:
        """A batch that does not simply fit: plan it (on a fresh reading where it matters), then let the policy decide."""
        account, members = self._account, self.group.members
        plan, offered, free = self._plan_against(totals, fresh=False)
        # About to chunk or fail, or to take over half of what the cached reading says is
        # free (where another process's allocation since would bite): read the device again.
        if plan is None or plan.chunks > 1 or 2 * plan.planned_bytes > free:
            plan, offered, free = self._plan_against(totals, fresh=True)
        if plan is None or plan.chunks > 1:  # not whole: the group's task makes room first (see _plan)
            if self._lease.lacks(totals, plan):
                return None  # the lease does not cover it: lease first, in the group's task (never inline)
            self._room = spill_room(account, batch, totals, offered, members)
            if self._room is not None:
                return None  # idle spillable arrays go to host, then it is planned again
            if not self._relieved and account.recovery.can_make_room:
                self._short = max(1, totals.fixed + totals.per_run * totals.runs - offered)
                return None  # the async reclaim hooks, once a batch; then the policy decides
        options = account.options
        if plan is None and options.active and options.policy is not Policy.WAIT:
            check_under_cap(self.name, account.ledger.held(members), account.budget.group_cap(members))
        decided = decide(
            plan,
            totals,
            offered=offered,
            policy=options.policy,
            passive=not options.active,
            if_empty=lambda: account.offered(members, free, as_if_empty=True),
            group=self.name,
            # for "not even one run fits": is a chunk axis wrong?
            hint=lambda: chunk_axis_hint((label, r) for t in batch for label, r in t.requests.arrays.items()),
        )
        if isinstance(decided, Wait):
            self._warn_if_waiting_on_itself(batch, decided, totals)
            return None
        return decided

    def _warn_if_waiting_on_itself(self, batch: list[Ticket], wait: Wait, totals: Totals) -> None:
        """Warn (once a ticket) when a batch waits for memory only its own members can give back (see
        :func:`waits_on_itself`): held by the task that awaits (a nested request), that wait never ends."""
        if all(id(t) in self._warned for t in batch):
            return
        keys = {t.key for t in batch}
        own = self._account.ledger.held(keys)
        if not own or not waits_on_itself(totals, wait, own):
            return
        self._warned.update(id(t) for t in batch)
        names = ", ".join(sorted({self._members[k].name for k in keys if k in self._members}))
        warn(self_wait_warning(self.name, names, own, wait))  # a warning, not a log line too: printed once

    def _plan_against(self, totals: Totals, *, fresh: bool) -> tuple[ChunkPlan | None, int, int]:
        free = self._account.free_memory(fresh=fresh)
        offered = self._account.offered(self.group.members, free)
        try:
            return totals.plan(offered), offered, free
        except PlanningError:
            return None, offered, free

    # -- in flight -----------------------------------------------------------------------------
    def poll(self) -> None:
        """Resolve the batches in flight whose events are done now (a waiting task polls)."""
        self.flights.poll()

    def polls(self, ticket: Ticket) -> bool:
        """True if ``ticket`` waits in flight on an event worth polling (a GPU's)."""
        return self.flights.polls(ticket)
