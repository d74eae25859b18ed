"""A group's batches in flight: allocated, sent to the device, resolved when their event completes.

:class:`Flights` allocates a planned batch through the account on the group's stream, records
what each ticket waited, and resolves the batches in stream order when the device reaches their
events (at once when it already has, else from the backend's callback handed to the loop thread),
then calls the group's ready hooks. The group's scheduler plans; this sends and lands. It is
handed what it needs and never reaches the manager.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._account import Account
from ._completion import Loop
from ._errors import AiocubieError, AllocationError, RegistrationError
from ._planner import ChunkPlan
from ._protocols import Event
from ._registry import Group, Member, await_hook, call_hook
from ._requests import ArrayResponse, RequestSet
from ._stats import Counters
from ._tickets import State, Ticket

__all__ = ["Flight", "Flights", "count"]

log = logging.getLogger("aiocubie")

Spawn = Callable[..., object]

#: What a member with nothing in a batch is answered with (its ready hook gets the plan).
_NOTHING = RequestSet({}, 0, 0, 0)


@attrs.define(eq=False)
class Flight:
    """A batch allocated and sent to the device, waiting for its event."""

    tickets: list[Ticket]
    plan: ChunkPlan
    stream: Any
    recorded: float
    event: Event
    done: bool = False  # the device reached the event


class Flights:
    """Sends a group's planned batches to the device and resolves them in stream order.

    Parameters
    ----------
    group : Group
        The group: its name, stream, copy streams, members' keys, hooks and counters (read live).
    members : mapping
        Every member by key (for ready hooks and names), read live.
    account : Account
        Allocates and releases.
    loop : Loop
        The running loop's primitives (thread-safe calls).
    spawn : callable
        ``spawn(async_fn, *args)`` starts a task that someone owns (async ready hooks).
    planning : callable
        The scheduler's batch being planned now (a reclaim hook may take tickets out of it).

    Attributes
    ----------
    queue : deque of Flight
        The batches in flight, in stream order.
    """

    def __init__(
        self,
        group: Group,
        members: Mapping[int, Member],
        account: Account,
        loop: Loop,
        spawn: Spawn,
        planning: Callable[[], list[Ticket]],
    ) -> None:
        self.group = group
        self.name = group.name
        self._members = members
        self._account = account
        self._loop = loop
        self._spawn = spawn
        self._planning = planning
        self.queue: deque[Flight] = deque()

    def tickets(self) -> list[Ticket]:
        """Every ticket in flight (cancelled ones too, until the device is done with their arrays)."""
        return [t for flight in self.queue for t in flight.tickets]

    def fail(self, error: AiocubieError) -> None:
        """A context reset: fail every ticket in flight (its arrays are gone); forget the flights."""
        for flight in self.queue:
            for ticket in flight.tickets:
                ticket.fail(error)
        self.queue.clear()  # their events' late callbacks find nothing to do

    def dispatch(self, batch: list[Ticket], plan: ChunkPlan, *, retry: bool) -> bool:
        """Allocate ``batch`` with ``plan`` and send it to the device.

        Returns False (nothing allocated) when the allocation failed on a stale free-memory
        reading and ``retry`` allows planning again; raises on any other failure.
        """
        account = self._account
        hook_calls = account.recovery.stats.hook_calls
        entries = [(batch[0].key, batch[0].requests)] if len(batch) == 1 else [(t.key, t.requests) for t in batch]
        try:
            responses, event = account.allocate(entries, self.name, plan, self.group.stream, self.group.copy_streams)
        except AllocationError:
            if retry and self._stale():
                return False
            raise
        if account.recovery.stats.hook_calls != hook_calls and (
            any(not t.pending for t in batch) or len(self._planning()) != len(batch)
        ):
            # a reclaim hook, called while the batch was allocated, unregistered or moved a
            # member: its tickets ended or left this group, so what they were given goes back
            # (nothing else runs user code during an allocation: a batch no hook ran for skips this)
            ours = {id(t) for t in self._planning()}
            kept = [(t, r) for t, r in zip(batch, responses) if t.pending and id(t) in ours]
            for ticket, response in zip(batch, responses):
                if not (ticket.pending and id(ticket) in ours):
                    account.release(response)
            if not kept:
                return True
            batch, responses = [t for t, _ in kept], [r for _, r in kept]
        self.land(batch, responses, plan, event)
        return True

    def _stale(self) -> bool:
        """True if the device has less free memory than the cached reading a failed allocation was
        planned on (another process took memory): plan again, once. Nothing is allocated now, so
        the cached reading is what the plan saw."""
        cached = self._account.free_memory(fresh=False)
        return self._account.free_memory(fresh=True) < cached

    def land(self, batch: list[Ticket], responses: list[ArrayResponse], plan: ChunkPlan, event: Event) -> None:
        """The tickets of an allocated batch get their ``responses``; they resolve now if the device
        reached ``event`` already, else when it does (in stream order, behind the batches in flight)."""
        now = time.perf_counter()
        chunks = plan.chunks
        stream = self.group.stream
        waiting = False  # a ticket resolves on the event (not stream-ordered)
        for ticket, response in zip(batch, responses):
            ticket.allocate(response)  # an ordered one is ready now: work on the stream runs after this
            waited = now - ticket.enqueued
            for counters in ticket.counters:
                counters.queue_wait.append(waited)
            if ticket.waits is not None:
                ticket.waits.append(waited)
            if ticket.priority:
                response.lease.priority = ticket.priority  # what its spillable arrays are spilled at
            if not ticket.ordered:
                waiting = True
        if (history := self._account.history) is not None:
            history.queued(self.name, batch)
        counted = batch[0].counters if len(batch) == 1 else {id(c): c for t in batch for c in t.counters}.values()
        for counters in counted:
            counters.batches += 1
            counters.chunks += chunks
        try:
            if not waiting and not self.group.hooks:  # nothing to resolve or call on the event
                return
            if not self.queue and event.query():  # done already, nothing before it: resolve now
                self.finish(batch, plan, stream, now)
                return
            flight = Flight(batch, plan, stream, now, event)
            self.queue.append(flight)
            if event.query():
                self._completed(flight)
            else:
                # the callback runs in this task's context, where anyio knows its loop (async
                # hooks are spawned from it); the loop's poller polls the event, then the thread
                self._loop.watch(event, contextvars.copy_context().run, self._completed, flight)
        except BaseException:  # the batch never resolves: take it back and free what it holds
            self.queue = deque(f for f in self.queue if f.tickets is not batch)
            for ticket in batch:
                self._account.release(ticket.response)
            raise

    def express(
        self, member: Member, requests: RequestSet, plan: ChunkPlan, ordered: bool, start: float
    ) -> ArrayResponse | Ticket | None:
        """Allocate one request of an idle group with ``plan``, with no ticket where none is needed
        (see ``GroupScheduler.express``; ``start``: when it was awaited).

        Returns the response when it is ready now (the device reached its event, or it is ordered)
        and the group has no ready hook; a ticket in flight (or ready, for its hooks) otherwise;
        None when nothing is allocated and the request must go the ordinary way: the allocation
        failed on a stale reading, or a reclaim hook moved its member (the response went back).
        Raises what the allocation raised; a member a reclaim hook unregistered gets a failed ticket.
        """
        account, group = self._account, self.group
        hook_calls = account.recovery.stats.hook_calls
        try:
            (response,), event = account.allocate(
                [(member.key, requests)], self.name, plan, group.stream, group.copy_streams
            )
        except AllocationError:
            if self._stale():
                return None
            raise
        counters = group.counters, member.counters
        if account.recovery.stats.hook_calls != hook_calls and not (
            member.key in group.members and self._members.get(member.key) is member
        ):
            account.release(response)  # a reclaim hook unregistered or moved its member meanwhile
            if self._members.get(member.key) is member:
                return None  # moved: asked again in its new group (registered anew, it is another member)
            count(counters)
            ticket = Ticket(member.key, requests, counters, ordered, member.priority, member.waits)
            ticket.fail(RegistrationError(f"{member.name} was unregistered before its request was served"))
            return ticket
        if group.hooks or not (ordered or event.query()):  # something to do on the event: a ticket
            ticket = Ticket(member.key, requests, counters, ordered, member.priority, member.waits)
            ticket.enqueued = start
            self.land([ticket], [response], plan, event)
            count(counters)  # after: a batch that could not be sent fails as a new ticket (GroupScheduler.express)
            return ticket
        # ready now, nothing to call: what land() and finish() count, without the ticket
        waited, chunks = time.perf_counter() - start, plan.chunks
        for each in counters:
            each.requests += 1
            each.express += 1
            each.queue_wait.append(waited)
            each.batches += 1
            each.chunks += chunks
            if not ordered:
                each.ready_latency.append(0.0)  # the device was there when the event was recorded
        if member.waits is not None:
            member.waits.append(waited)
        if member.priority:
            response.lease.priority = member.priority  # what its spillable arrays are spilled at
        if (history := account.history) is not None:
            history.express(self.name, member.key, member.priority, start)
        return response

    def poll(self) -> None:
        """Resolve the batches in flight whose events are done now (a waiting task polls)."""
        reached = None
        for flight in self.queue:  # events of one stream complete in order
            if not flight.event.query():
                break
            reached = flight
        if reached is not None:
            self._completed(reached)

    def polls(self, ticket: Ticket) -> bool:
        """True if ``ticket`` waits in flight on an event worth polling (a GPU's)."""
        return ticket.state is State.ALLOCATED and any(
            flight.event.pollable for flight in self.queue if ticket in flight.tickets
        )

    def _completed(self, flight: Flight) -> None:
        """The device reached ``flight``'s event: resolve every completed batch at the head.

        Runs in the loop thread (no task per batch). Events of one stream complete in order,
        so every flight before this one is done too; batches resolve first in, first out.
        """
        if flight not in self.queue:  # failed by a reset or a close meanwhile
            return
        for each in self.queue:
            each.done = True
            if each is flight:
                break
        try:
            while self.queue and self.queue[0].done:
                done = self.queue.popleft()
                self.finish(done.tickets, done.plan, done.stream, done.recorded)
        except Exception:  # a loop callback must not raise: trio would crash the whole run
            log.exception("group %r: resolving a batch failed", self.name)

    def finish(self, tickets: list[Ticket], plan: ChunkPlan, stream: Any, recorded: float) -> None:
        """The device is done with a batch: resolve its tickets, then call the ready hooks."""
        latency = time.perf_counter() - recorded
        for ticket in tickets:
            unclaimed = ticket.ready()
            if unclaimed is not None:  # cancelled while in flight
                self._account.release(unclaimed)
            elif ticket.state is State.READY:
                for counters in ticket.counters:
                    counters.ready_latency.append(latency)
        if (history := self._account.history) is not None:
            history.ready(self.name, tickets)
        if self.group.hooks:
            self._run_hooks(tickets, plan, stream)

    def _run_hooks(self, tickets: list[Ticket], plan: ChunkPlan, stream: Any) -> None:
        """Call the ready hooks: members with nothing in the batch get the plan with no arrays
        (those registered with an owner only when a member of their owner asked in it).

        Async hooks run as tasks of the manager, so a slow hook never holds up resolution.
        """
        served = [(t.key, t.response) for t in tickets if t.state is State.READY]
        asked = {key for key, _ in served}
        owners: set[int] | None = None  # the owners that asked, worked out when a scoped member needs them
        for key in self.group.members - asked:
            member = self._members.get(key)
            if member is not None and member.has_ready_hook:
                if member.owner is not None:
                    if owners is None:
                        owners = {m.owner_key for k in asked if (m := self._members.get(k)) is not None}
                    if member.owner not in owners:
                        continue
                served.append((key, self._account.respond(_NOTHING, [], plan, stream)))
        for key, response in served:
            member = self._members.get(key)
            if member is None or response is None:
                continue
            hook = member.ready_hook  # None once the instance of a weakly held hook is gone
            if hook is None:
                continue
            if member.ready_async:
                # called inside its task: a task cancelled before it starts leaves no coroutine
                # behind that was never awaited
                self._spawn(call_hook, hook, (response,), f"allocation-ready hook of {member.name}")
                continue
            try:
                result = hook(response)
                if inspect.isawaitable(result):  # a plain callable that returned an awaitable
                    self._spawn(await_hook, result, f"allocation-ready hook of {member.name}")
            except Exception:
                log.exception("allocation-ready hook of %s raised; the scheduler goes on", member.name)


def count(counters: tuple[Counters, ...]) -> None:
    """One more request asked in the group and by the member of ``counters``, through the express path."""
    for each in counters:
        each.requests += 1
        each.express += 1
