"""The batches of a batch stream queued on the device and not yet landed."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from .._protocols import Event
from ._transfer import Transfer

__all__ = ["InFlight"]


class InFlight:
    """Batches queued on the group's stream and not yet landed, at most ``limit`` of them.

    Parameters
    ----------
    transfer : Transfer
        The walk's copies (its device, stream and event loop).
    limit : int
        Batches in flight, at most.

    Notes
    -----
    A walk asks :meth:`queued` after each batch (no await) and awaits :meth:`wait` only when it
    says so: the host waits to keep at most ``limit`` batches in flight, and gives the event loop
    a turn at least once every ``limit + 1`` batches when the device keeps ahead of it.
    """

    __slots__ = ("landed", "limit", "transfer", "unturned")

    def __init__(self, transfer: Transfer, limit: int) -> None:
        self.transfer, self.limit = transfer, limit
        # a batch's outputs in place, and its host arrays (a copy knows only their addresses), oldest first
        self.landed: collections.deque[tuple[Event, tuple[np.ndarray[Any, Any], ...]]] = collections.deque()
        self.unturned = 0  # batches since the walk last gave the event loop a turn

    def queued(self, hosts: tuple[np.ndarray[Any, Any], ...]) -> bool:
        """A batch with ``hosts`` was queued: whether the walk must :meth:`wait` before reading the next."""
        transfer, landed = self.transfer, self.landed
        landed.append((transfer.device.record_event(transfer.stream), hosts))
        if len(landed) >= self.limit:  # before the next batch is read: it may refill the arrays that land here
            if not landed[0][0].query():
                return True
            landed.popleft()  # landed already: no trip through the loop
        self.unturned += 1
        return self.unturned > self.limit

    async def wait(self) -> None:
        """Wait for the oldest batch to land, or (the device keeps ahead) give the event loop a turn."""
        landed, loop = self.landed, self.transfer.loop
        if len(landed) >= self.limit:
            await loop.wait(landed[0][0])
            landed.popleft()
            self.unturned = 1
        else:  # the loop gets a turn all the same
            await loop.checkpoint()
            self.unturned = 0

    async def drain(self) -> None:
        """Wait until every batch in flight has landed."""
        landed, loop = self.landed, self.transfer.loop
        while landed:
            await loop.wait(landed[0][0])
            landed.popleft()
