"""Stream groups at work: one scheduler per live group, the requests they serve, every fan-out.

Handed the registry, the device account and the serving loop, it starts a group's scheduler
when the group is first needed while the manager serves, submits and awaits requests, keeps an
emptied group's scheduler until its batches in flight land, moves a member's queued requests
when it changes group, and tells every scheduler of a change, a reset, a release or the close.
It owns no budget, ledger or stream (the registry makes those) and never reaches the manager.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._accounting import DeviceAccount
from ._completion import SPIN, Loop
from ._errors import AiocubieError, InsufficientMemoryError, ManagerStateError, ReleasedError
from ._ledger import Allocation
from ._planner import plan_chunks
from ._registry import Group, Member, Registry
from ._requests import ArrayResponse, RequestSet
from ._scheduler import GroupScheduler
from ._serving import Serving
from ._stats import GroupStatistics
from ._tickets import State, Ticket
from ._waiting import WaitingLine

__all__ = ["PendingRequest", "StreamGroups"]

_AWAITED_TWICE = "a request can be awaited only once: call mgr.request() again"


class PendingRequest:
    """An allocation request: await it for an :class:`ArrayResponse`, or use ``async with``.

    ``async with mgr.request(obj, {...}) as response:`` frees the arrays on exit. Cancelling
    the awaiting task withdraws a queued request and frees an allocated one.
    """

    __slots__ = (
        "_awaited",
        "_instance",
        "_member",
        "_ordered",
        "_priority",
        "_release",
        "_replace",
        "_requests",
        "_response",
        "_serve",
    )

    def __init__(
        self,
        serve: Callable[
            [object, Member, RequestSet, bool, bool, PendingRequest | None, int | None], Awaitable[ArrayResponse]
        ],
        release: Callable[[ArrayResponse], object],
        instance: object,
        member: Member,
        requests: RequestSet,
        replace: bool = False,
        ordered: bool = False,
        priority: int | None = None,
    ) -> None:
        self._serve = serve  # submits the request when it is awaited, and waits for it (see StreamGroups.serve)
        self._release = release
        self._instance = instance
        self._member = member
        self._requests = requests
        self._replace = replace  # free the instance's arrays of these labels first
        self._ordered = ordered  # ready once allocated, in stream order
        self._priority = priority  # None: the member's
        self._response: ArrayResponse | None = None
        self._awaited = False

    def __await__(self) -> Generator[Any, None, ArrayResponse]:
        if self._awaited:
            raise ManagerStateError(_AWAITED_TWICE)
        self._awaited = True
        return self._serve(
            self._instance, self._member, self._requests, self._replace, self._ordered, None, self._priority
        ).__await__()

    def __aenter__(self) -> Awaitable[ArrayResponse]:
        # the serving coroutine itself, no coroutine of its own: it hands the response here for __aexit__
        if self._awaited:
            raise ManagerStateError(_AWAITED_TWICE)
        self._awaited = True
        return self._serve(
            self._instance, self._member, self._requests, self._replace, self._ordered, self, self._priority
        )

    if not TYPE_CHECKING:  # at run time only: a type checker flags a missing await itself

        def __getattr__(self, name: str) -> Any:
            """A forgotten ``await``: say what to write, not just that the attribute is missing."""
            if name.startswith("__"):
                raise AttributeError(name)
            raise AttributeError(
                f"a PendingRequest has no attribute {name!r}: it is a request not yet awaited, not an "
                "ArrayResponse; write `response = await mgr.request(...)` or "
                "`async with mgr.request(...) as response:`"
            )

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._response is not None:
            self._release(self._response)


class StreamGroups:
    """The schedulers of one manager's stream groups.

    Parameters
    ----------
    registry : Registry
        The groups and members (read live).
    account : DeviceAccount
        Each scheduler plans and allocates through it; what a fan-out ends is released there.
    serving : Serving
        The loop and task group the schedulers run in, while the manager serves.
    on_retired : callable
        ``on_retired(name)`` when a group loses its last member (its scheduler stopped).
    """

    def __init__(
        self, registry: Registry, account: DeviceAccount, serving: Serving, on_retired: Callable[[str], None]
    ) -> None:
        self._registry = registry
        self._account = account
        self._serving = serving
        self._on_retired = on_retired
        account.listen(self.changed)  # released memory, caps or options: a waiting batch checks again
        self.schedulers: dict[str, GroupScheduler] = {}  # one per live group, while serving
        self._draining: list[GroupScheduler] = []  # of emptied groups, until their flights land
        self._line = WaitingLine(self.changed)  # batches waiting for memory across groups (passive, wait)

    # -- schedulers ----------------------------------------------------------------------------
    def start(self) -> None:
        """The manager serves now: start the scheduler of every group."""
        for group in list(self._registry.groups.values()):
            self._start(group)

    def scheduler_of(self, name: str) -> GroupScheduler | None:
        """The scheduler of group ``name``, started if the manager serves (None if it does not)."""
        scheduler = self.schedulers.get(name)
        if scheduler is None and self._serving.loop is not None:
            scheduler = self._start(self._registry.groups[name])
        return scheduler

    def _start(self, group: Group) -> GroupScheduler:
        serving = self._serving
        assert serving.task_group is not None and serving.loop is not None
        scheduler = GroupScheduler(
            group, self._registry.members, self._account, serving.loop, serving.task_group.start_soon, self._line
        )
        self.schedulers[group.name] = scheduler
        serving.task_group.start_soon(scheduler.run, name=f"aiocubie scheduler {group.name!r}")
        return scheduler

    def retire(self, name: str) -> None:
        """Group ``name`` lost its last member: stop its scheduler task.

        Its stream is dropped with the group (batches in flight keep it until they land).
        """
        scheduler = self.schedulers.pop(name, None)
        self._draining = [s for s in self._draining if s.pending()]
        if scheduler is not None:
            scheduler.stop()
            if scheduler.pending():  # in-flight batches resolve from loop callbacks, no task
                self._draining.append(scheduler)
        self._on_retired(name)

    def every(self) -> list[GroupScheduler]:
        """The schedulers of live groups, and of emptied ones whose batches are still in flight."""
        return [*self.schedulers.values(), *self._draining] if self._draining else list(self.schedulers.values())

    def statistics(self) -> tuple[dict[str, GroupStatistics], int]:
        """Each live group's requests by stage, and how many emptied groups still have batches in flight."""
        groups = {name: GroupStatistics(*s.census(), _by_priority(s.pending())) for name, s in self.schedulers.items()}
        return groups, sum(1 for s in self._draining if s.pending())

    # -- requests ------------------------------------------------------------------------------
    async def serve(
        self,
        member: Member,
        requests: RequestSet,
        loop: Loop,
        ordered: bool = False,
        holder: PendingRequest | None = None,
        priority: int | None = None,
    ) -> ArrayResponse:
        """Submit ``member``'s request to its group's scheduler and wait for it (in ``loop``'s thread).

        ``ordered``: ready once allocated, ordered on the group's stream, rather than once the
        device reaches the allocation's event. Cancelled while it waits, the request is
        withdrawn (queued) or its arrays freed (allocated). ``holder``: the PendingRequest whose
        ``async with`` releases the response on exit (it is handed the response). ``priority``:
        among requests waiting for memory, higher first (None: the member's).
        """
        scheduler = self.schedulers[member.group]
        # the express path serves a member's own priority (an idle group has no one to order)
        served = scheduler.express(member, requests, ordered) if priority is None else None
        if served.__class__ is ArrayResponse:  # served in this task, ready now: no ticket
            try:
                await loop.checkpoint()  # awaiting a request is a checkpoint, even one served at once
            except BaseException:
                self._account.release(served)  # as Ticket.cancel() of a ready ticket
                scheduler.group.counters.cancellations += 1
                member.counters.cancellations += 1
                raise
            if holder is not None:
                holder._response = served
            return served
        if served is None:  # the ordinary way: queued, or served by submit (in its member's group now)
            group = self._registry.groups[member.group]
            counters = (group.counters, member.counters)
            if priority is None:  # positional: every request passes here
                ticket = Ticket(member.key, requests, counters, ordered, member.priority, member.waits)
            else:
                ticket = Ticket(member.key, requests, counters, ordered, priority, self._registry.waits(priority))
            group.counters.requests += 1
            member.counters.requests += 1
            # queued (or served, when it closes a batch at once) in the order requests are awaited
            scheduler = self.schedulers[member.group]
            scheduler.submit(ticket)
        else:
            ticket = served  # type: ignore[assignment]
        try:
            if ticket.state is State.READY or ticket.done:
                await loop.checkpoint()  # awaiting a request is a checkpoint, even one served at once
            else:
                # its event may be reached soon: poll it a while (a queued ticket, PENDING, has none)
                if ticket.state is State.ALLOCATED and scheduler.polls(ticket):
                    deadline = time.perf_counter() + SPIN
                    while not ticket.done and time.perf_counter() < deadline:
                        await loop.checkpoint()
                        scheduler.poll()
                await ticket.wait(loop.signal)
        except BaseException:
            self._cancel(ticket)
            raise
        response = ticket.result()
        if holder is not None:
            holder._response = response
        return response

    def _cancel(self, ticket: Ticket) -> None:
        was_pending = ticket.pending
        self._account.release(ticket.cancel())
        if was_pending:
            for scheduler in self.schedulers.values():
                scheduler.withdraw(ticket)

    def allocate_now(self, member: Member, requests: RequestSet) -> ArrayResponse:
        """Allocate ``requests`` for ``member`` now, unbatched and whole, on its group's stream.

        Raises
        ------
        InsufficientMemoryError
            If the arrays do not fit whole in what the group is offered.
        AllocationError
            If the backend fails (nothing stays allocated).
        """
        group = self._registry.groups[member.group]
        account = self._account
        free = account.free_memory(fresh=True)
        offered = account.offered(group.members, free)
        plan = plan_chunks(requests.runs, requests.fixed, requests.per_run, offered, passive=not account.options.active)
        if plan.chunks > 1:
            raise InsufficientMemoryError(
                f"allocate() needs {plan.full_bytes} bytes whole but group {member.group!r} is "
                f"offered {plan.offered}: use await mgr.request() to have it chunked"
            )
        (response,), _ = account.allocate(
            [(member.key, requests)], member.group, plan, group.stream, group.copy_streams
        )
        return response

    def free_where(self, predicate: Callable[[Allocation], bool], cause: str) -> None:
        """Free every array for which ``predicate`` is true; requests in flight holding one fail."""
        # a library's bytes counted against a member (torch_allocations: no block) are the library's
        # to free: dropping their count would not free them, only move them to other_bytes
        arrays = self._account.release_where(lambda a: a.block is not None and predicate(a))
        owners = {id(a.owner) for a in arrays}
        if owners:
            self.fail_in_flight(
                owners, ReleasedError(f"{cause} freed this request's arrays before it resolved; request again")
            )

    # -- fan-outs ------------------------------------------------------------------------------
    def changed(self) -> None:
        """Caps, options or holdings changed: every batch waiting for memory checks again."""
        for scheduler in self.schedulers.values():
            scheduler.changed()

    def flush(self, group: str | None) -> None:
        """Close the batch being collected in ``group`` (all groups if None) now."""
        names = list(self.schedulers) if group is None else [self._registry.group(group).name]
        for name in names:
            scheduler = self.schedulers.get(name)
            if scheduler is not None:
                scheduler.flush()

    def drop(self, key: int, error: AiocubieError) -> None:
        """Member ``key`` left: end its open requests with ``error``, releasing what they hold."""
        for scheduler in self.every():
            for response in scheduler.drop(key, error):
                self._account.release(response)

    def fail_in_flight(self, owners: set[int], error: AiocubieError) -> None:
        """Fail the in-flight requests whose response (by id) is in ``owners``; release the rest of them."""
        for scheduler in self.every():
            for response in scheduler.fail_in_flight(owners, error):
                self._account.release(response)

    def reset(self, error: AiocubieError) -> None:
        """A context reset: fail every in-flight request with ``error`` (queued ones stay)."""
        for scheduler in self.every():
            scheduler.reset(error)

    def close(self, error: AiocubieError) -> None:
        """The manager closes: fail every open request with ``error``, release, stop every scheduler."""
        schedulers, self.schedulers = [*self.schedulers.values(), *self._draining], {}
        self._draining = []
        for scheduler in schedulers:
            for response in scheduler.close(error):
                self._account.release(response)

    def is_grouped(self, member: Member) -> bool:
        """True if ``member`` shares its stream group with another member."""
        return len(self._registry.groups[member.group].members) > 1

    def names(self) -> dict[str, list[str]]:
        """Group name -> the names of its members."""
        members = self._registry.members
        return {
            name: sorted(members[key].name for key in group.members) for name, group in self._registry.groups.items()
        }

    # -- members moving --------------------------------------------------------------------------
    def move(self, member: Member, name: str) -> None:
        """Move ``member`` to group ``name`` (made if new), with its queued requests.

        What it holds counts in the new group from then on; an emptied old group is retired.
        """
        old, new = self._registry.move(member, name)
        if old is not new:
            # what it holds counts in its new group from now on, as its budget does
            self._account.regroup(member.key, old.name, new.name)
            moving = self.schedulers[old.name].take(member.key) if old.name in self.schedulers else []
            target = self.scheduler_of(new.name)
            if target is not None:
                target.adopt(moving)
            if old.name not in self._registry.groups:
                self.retire(old.name)
        self.changed()


def _by_priority(tickets: list[Ticket]) -> dict[int, int]:
    """How many of ``tickets`` are queued or being planned, by priority."""
    counts: dict[int, int] = {}
    for ticket in tickets:
        if ticket.pending:
            counts[ticket.priority] = counts.get(ticket.priority, 0) + 1
    return counts
