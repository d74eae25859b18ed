"""Priorities among requests waiting for memory: the one rule that orders them, with aging.

Pure (no event loop, no device): a waiter's rank from its priority, when it came and how long it
has waited. The group's queue and the waiting line across groups both order by it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

__all__ = ["Waiter", "effective", "outranked", "outranks", "rank", "ranked", "standing"]


class Waiter(Protocol):
    """A request waiting for memory, as this rule reads it (a ticket is one)."""

    priority: int
    enqueued: float

    @property
    def pending(self) -> bool:
        """True while it waits."""


W = TypeVar("W", bound=Waiter)


def effective(priority: int, since: float, now: float, aging: float | None) -> int:
    """``priority`` raised by one level for every ``aging`` seconds waited since ``since`` (None: never).

    Examples
    --------
    >>> effective(0, since=10.0, now=10.25, aging=0.1), effective(0, 10.0, 99.0, None)
    (2, 0)
    """
    if aging is None or now <= since:
        return priority
    return priority + math.floor((now - since) / aging)


def rank(priority: int, since: float, now: float, aging: float | None) -> tuple[int, float]:
    """The sort key of a waiter: higher effective priority first, then first come, first served.

    Examples
    --------
    >>> sorted([(0, 1.0), (5, 2.0), (0, 0.5)], key=lambda w: rank(*w, now=2.0, aging=None))
    [(5, 2.0), (0, 0.5), (0, 1.0)]
    """
    return (-effective(priority, since, now, aging), since)


def outranks(waiter: tuple[int, float], other: tuple[int, float], now: float, aging: float | None) -> bool:
    """True if ``waiter`` (priority, since) goes before ``other``, which has another priority.

    Requests of one priority are not held behind each other by this rule (their own order is
    first come, first served); between priorities the higher effective priority goes first, and
    on a tie the one that came first. So a request of priority ``p`` waits behind requests of
    priority ``q > p`` that came after it for at most ``(q - p) * aging`` seconds.

    Examples
    --------
    >>> outranks((5, 2.0), (0, 1.0), now=2.0, aging=None)
    True
    >>> outranks((5, 2.0), (0, 1.0), now=2.0, aging=0.1)  # the old one has waited 10 levels' worth
    False
    >>> outranks((0, 1.0), (0, 2.0), now=2.0, aging=0.1)  # one priority: not this rule's to order
    False
    """
    if waiter[0] == other[0]:
        return False
    return rank(*waiter, now, aging) < rank(*other, now, aging)


def ranked(waiters: Iterable[W], now: float, aging: float | None) -> list[W]:
    """``waiters`` in the order they go: by :func:`rank` as of ``now``."""
    return sorted(waiters, key=lambda w: rank(w.priority, w.enqueued, now, aging))


def standing(batch: Sequence[Waiter]) -> tuple[int, float]:
    """A batch's place in a line: its priority (one a batch: its first request's) and when its oldest request came."""
    return batch[0].priority, min(w.enqueued for w in batch)


def outranked(batch: Sequence[Waiter], queue: Iterable[Waiter], now: float, aging: float | None) -> bool:
    """True if a request still waiting in ``queue`` goes before the waiting ``batch`` (:func:`outranks`)."""
    mine = standing(batch)
    return any(w.pending and outranks((w.priority, w.enqueued), mine, now, aging) for w in queue)
