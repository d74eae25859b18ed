"""The policy's decision for a batch that does not simply fit: chunk, wait, or fail.

Pure, beside the planner: it is handed the plan against what is offered now and the offer the
group would have if it held nothing; it reads no device, keeps no state and knows no scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import attrs

from ._errors import InsufficientMemoryError, PlanningError
from ._options import Policy
from ._planner import ChunkPlan, plan_chunks
from ._stats import format_bytes

__all__ = ["Totals", "Wait", "check_under_cap", "decide", "longest_head", "self_wait_message", "waits_on_itself"]


class Totals(NamedTuple):
    """A batch's totals, as :func:`plan_chunks` takes them."""

    runs: int
    fixed: int
    per_run: int
    buffered: int

    def plan(self, offered: int, *, hint: Callable[[], str] | None = None, passive: bool = False) -> ChunkPlan:
        """:func:`plan_chunks` of these totals against ``offered`` bytes (raises :class:`PlanningError`)."""
        return plan_chunks(
            self.runs, self.fixed, self.per_run, offered, buffered=self.buffered, hint=hint, passive=passive
        )


@attrs.frozen
class Wait:
    """Wait for memory: the batch waits until it can have ``best``, its plan were ``offered`` bytes free.

    Attributes
    ----------
    best : ChunkPlan
        The plan the batch would get if its group (passive: the manager) held nothing.
    offered : int
        The bytes it would be offered then.
    """

    best: ChunkPlan
    offered: int


def decide(
    plan: ChunkPlan | None,
    totals: Totals,
    *,
    offered: int,
    policy: Policy,
    passive: bool,
    if_empty: Callable[[], int],
    group: str,
    hint: Callable[[], str] | None = None,
) -> ChunkPlan | Wait:
    """What a batch of ``totals`` does under ``policy``, given ``plan``: its plan against ``offered`` now.

    Parameters
    ----------
    plan : ChunkPlan or None
        ``totals.plan(offered)`` (None: not even one run fits now).
    totals : Totals
        The batch's totals.
    offered : int
        The bytes the batch may take now.
    policy : Policy
        ``chunk`` takes the plan there is; ``fail`` takes it only whole (in active mode);
        ``wait`` takes it if it is as good as the best plan there could be, else waits.
    passive : bool
        Passive mode (``fail`` chunks there, as ``chunk`` does).
    if_empty : callable
        The bytes the batch would be offered if its group (passive: the manager) held nothing;
        called under policy ``wait`` only.
    group : str
        The group's name, for the error.
    hint : callable, optional
        As for :func:`plan_chunks`.

    Returns
    -------
    ChunkPlan or Wait
        The plan to allocate now, or what to wait for.

    Raises
    ------
    PlanningError
        When the batch cannot fit now (``chunk``) or even if memory were released (``wait``).
    InsufficientMemoryError
        Policy ``fail`` in active mode, for a batch that does not fit whole.

    Examples
    --------
    >>> totals = Totals(runs=100, fixed=0, per_run=8, buffered=8)
    >>> now = totals.plan(400)  # 50 runs fit now: 2 chunks
    >>> decide(now, totals, offered=400, policy=Policy.CHUNK, passive=False, if_empty=lambda: 800, group="g").chunks
    2
    >>> decide(now, totals, offered=400, policy=Policy.WAIT, passive=False, if_empty=lambda: 800, group="g")
    Wait(best=ChunkPlan(runs=100, chunks=1, chunk_length=100, offered=800, planned_bytes=800, full_bytes=800), offered=800)
    """
    if policy is Policy.CHUNK or (passive and policy is Policy.FAIL):
        # raises why it cannot fit
        return plan or totals.plan(offered, hint=hint, passive=passive)
    if plan is not None and plan.chunks == 1:
        return plan
    if policy is Policy.FAIL:
        raise InsufficientMemoryError(
            f"policy 'fail': the batch needs {totals.fixed + totals.per_run * totals.runs} bytes whole but group "
            f"{group!r} is offered {offered}; release memory, or use policy 'chunk' or 'wait'"
        )
    # policy wait: take the best plan there could be once memory is released (raises at once if
    # even that cannot fit: bigger than the device, its memory_limit or the group's cap)
    empty = if_empty()
    best = totals.plan(empty, hint=hint, passive=passive)
    if plan is None or plan.planned_bytes < best.planned_bytes:
        return Wait(best, empty)
    return plan


def waits_on_itself(totals: Totals, wait: Wait, own: int) -> bool:
    """Whether a batch that must ``wait`` waits on the ``own`` bytes its requesters hold.

    If every other member released everything, it would be offered ``wait.offered - own``: if its
    best plan does not fit even then, only its requesters' own release can let it through.

    Examples
    --------
    >>> totals = Totals(runs=100, fixed=0, per_run=8, buffered=8)
    >>> wait = Wait(totals.plan(800), 800)
    >>> waits_on_itself(totals, wait, own=100), waits_on_itself(totals, wait, own=0)
    (True, False)
    """
    try:
        without = totals.plan(max(0, wait.offered - own))
    except PlanningError:
        return True
    return without.planned_bytes < wait.best.planned_bytes


def self_wait_message(group: str, names: str, own: int, wait: Wait) -> str:
    """The warning for a batch of ``names`` in ``group`` that waits for the ``own`` bytes its requesters hold."""
    return (
        f"group {group!r}, policy 'wait': a request of {names} waits for memory its own requester(s) "
        f"hold ({format_bytes(own)}): it needs {format_bytes(wait.best.planned_bytes)} of the "
        f"{format_bytes(wait.offered)} the group could offer, and is served only once they release. If the task "
        "that awaits it holds those arrays (a request nested in another's `async with`), it waits forever: "
        "release them first, ask for less, or use policy 'chunk'"
    )


def check_under_cap(group: str, held: int, cap: int) -> None:
    """Raise if ``group`` holds more than its cap: it starts no batch (under ``chunk`` or ``fail``) until back under.

    Raises
    ------
    InsufficientMemoryError
        If ``held > cap``.
    """
    if held > cap:
        raise InsufficientMemoryError(
            f"group {group!r} holds {held} bytes, over its cap of {cap} (members joined the auto "
            "pool or moved groups since): it starts no new batch until it is back under; release arrays"
        )


def longest_head(count: int, fits: Callable[[int], bool]) -> int:
    """The longest head of ``count`` requests that ``fits``, given that 1 fits and ``count`` does not.

    A longer head needs no less memory, so it bisects: ``fits`` is called about ``log2(count)`` times.

    Examples
    --------
    >>> longest_head(10, lambda n: n <= 6)
    6
    """
    fit, too_many = 1, count
    while too_many - fit > 1:
        middle = (fit + too_many) // 2
        if fits(middle):
            fit = middle
        else:
            too_many = middle
    return fit
