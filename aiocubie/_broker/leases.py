"""The broker's record: the node budget, each client's lease, and the clients waiting for one.

Pure bookkeeping: it is told what a client asks and returns, and answers with the messages to send
(to whom); it does no I/O and knows no socket. Waiters are served by priority, then first come
first served, and never skipped for the node's room: bytes that come free go to the head of the
line first. One process's clients together lease at most its share (``--split``); a waiter whose
process holds its share waits for its own process, and the line goes on past it.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from typing import Any, Final

import attrs

from .._stats import format_bytes

__all__ = ["Client", "Leases", "Outbox"]

#: The messages to send: (client, message) pairs, in order.
Outbox = list[tuple["Client", dict[str, Any]]]
#: The processes whose peaks the record keeps after their last client left (the latest ones).
GONE_KEPT: Final = 256


@attrs.define(eq=False)
class Client:
    """One connected manager: who it is and what it holds."""

    pid: int
    uid: int | None
    name: str
    lease: int = 0


@attrs.define(eq=False)
class _Process:
    """What one process's clients lease together now, and the most they ever did."""

    lease: int = 0
    peak: int = 0
    clients: int = 0


@attrs.define(eq=False)
class _Waiter:
    client: Client
    id: int
    least: int
    want: int
    priority: int
    seq: int
    since: float


class Leases:
    """The leases of one device's node budget.

    Parameters
    ----------
    budget : int
        The bytes every client's lease together may not exceed.
    share : int, optional
        The bytes one process's clients together may not exceed (default: the budget).

    Attributes
    ----------
    leased : int
        Bytes leased now, every client together.
    peak : int
        The most ever leased at once (the record a test checks against the budget).
    """

    def __init__(self, budget: int, share: int | None = None) -> None:
        self.budget = budget
        self.share = budget if share is None else min(share, budget)
        self.clients: list[Client] = []
        self.leased = 0
        self.peak = 0
        self._processes: OrderedDict[int, _Process] = OrderedDict()  # by pid; the latest gone ones kept
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._pressure = False

    def join(self, client: Client, hold: int) -> Outbox:
        """``client`` connected, holding ``hold`` bytes already (it reconnects after a broker restart)."""
        self.clients.append(client)
        process = self._processes.setdefault(client.pid, _Process())
        process.clients += 1
        self._processes.move_to_end(client.pid)
        self._add(client, hold)
        return [(client, {"op": "pressure", "on": True})] if self._pressure else []

    def leave(self, client: Client) -> Outbox:
        """``client``'s connection closed: its lease and its waits end; serve who waits."""
        if client not in self.clients:
            return []
        self.clients.remove(client)
        self._waiters = [w for w in self._waiters if w.client is not client]
        self._take_back(client, client.lease)
        process = self._processes[client.pid]
        process.clients -= 1
        gone = [pid for pid, each in self._processes.items() if not each.clients]
        for pid in gone[: max(0, len(gone) - GONE_KEPT)]:  # the oldest first
            del self._processes[pid]
        return self._serve()

    def ask(self, client: Client, id: int, least: int, want: int, wait: bool, priority: int) -> Outbox:
        """``client`` asks for at least ``least`` bytes more, ``want`` if it can (request ``id``).

        Granted at once when there is room beside what the waiters before it need; otherwise it
        waits (``wait``) or is denied, with what the other clients hold.
        """
        if wait:
            # never more than its share could give it: a batch larger than that waits for all of it
            least = max(0, min(least, self.share - client.lease))
            self._waiters.append(_Waiter(client, id, least, want, priority, next(self._seq), time.monotonic()))
            self._waiters.sort(key=lambda w: (-w.priority, w.seq))
            return self._serve()
        head = next((w.least for w in self._waiters if not self._passed(w)), 0)  # the head goes first
        room = min(self.budget - self.leased - head, self._share_room(client))
        out: Outbox = []
        if room >= least:
            grant = max(0, min(want, room))
            self._add(client, grant)
            out.append((client, {"op": "granted", "id": id, "bytes": grant}))
        else:
            grant = 0
            out.append((client, {"op": "denied", "id": id, "reason": self.why(client, least)}))
        if grant < want:  # short: the others give back their idle slabs, for its next ask
            out += [(c, {"op": "reclaim"}) for c in self.clients if c is not client and c.lease]
        return out

    def cancel(self, client: Client, id: int) -> Outbox:
        """``client`` no longer waits for request ``id`` (no answer); serve who waits behind it."""
        self._waiters = [w for w in self._waiters if not (w.client is client and w.id == id)]
        return self._serve()

    def give_back(self, client: Client, nbytes: int) -> Outbox:
        """``client`` returns ``nbytes`` of its lease (at most what it holds); serve who waits."""
        self._take_back(client, min(nbytes, client.lease))
        return self._serve()

    def why(self, client: Client, least: int) -> str:
        """Why ``least`` bytes cannot be leased to ``client`` now: the budget and who holds it."""
        others = [c for c in self.clients if c is not client and c.lease]
        held = ", ".join(f"pid {c.pid}{f' ({c.name})' if c.name else ''} {format_bytes(c.lease)}" for c in others)
        share = ""
        if self.share < self.budget:
            mine = self._processes[client.pid].lease
            share = f"; this process holds {format_bytes(mine)} of its share of {format_bytes(self.share)}"
        if client.lease + least > self.budget:
            fix = "more than the node budget: a larger --budget, or policy 'chunk'"
        elif client.lease + least > self.share:
            fix = "more than a process's share: a smaller --split, or policy 'chunk'"
        else:
            fix = "policy 'wait' waits for them, 'chunk' takes what there is"
        return (
            f"{format_bytes(least)} more cannot be leased: {format_bytes(self.leased)} of the node budget of "
            f"{format_bytes(self.budget)} is leased (this client {format_bytes(client.lease)}; others: "
            f"{held or 'none'}{share}), {len(self._waiters)} waiting; {fix}"
        )

    def status(self) -> dict[str, Any]:
        """The record as plain data: budget, leased, peak, clients and waiters."""
        now = time.monotonic()
        return {
            "budget": self.budget,
            "share": self.share,
            "leased": self.leased,
            "peak": self.peak,
            "clients": [{"pid": c.pid, "uid": c.uid, "name": c.name, "lease": c.lease} for c in self.clients],
            "processes": [
                {"pid": pid, "lease": each.lease, "peak": each.peak, "clients": each.clients}
                for pid, each in self._processes.items()
            ],
            "waiters": [
                {"pid": w.client.pid, "least": w.least, "priority": w.priority, "waited": round(now - w.since, 3)}
                for w in self._waiters
            ],
        }

    def _share_room(self, client: Client) -> int:
        return self.share - self._processes[client.pid].lease

    def _passed(self, waiter: _Waiter) -> bool:
        """True if the node has room for ``waiter`` but its process's share has not: the line goes on past it."""
        return self._share_room(waiter.client) < waiter.least <= self.budget - self.leased

    def _add(self, client: Client, nbytes: int) -> None:
        client.lease += nbytes
        self.leased += nbytes
        self.peak = max(self.peak, self.leased)
        process = self._processes[client.pid]
        process.lease += nbytes
        process.peak = max(process.peak, process.lease)

    def _take_back(self, client: Client, nbytes: int) -> None:
        client.lease -= nbytes
        self.leased -= nbytes
        self._processes[client.pid].lease -= nbytes

    def _serve(self) -> Outbox:
        """Grant the waiters in line order while the node has room; say when pressure starts or ends.

        A waiter whose own process holds its share is passed over (it waits for its process, not
        the node); the first other waiter the node has no room for stops the line.
        """
        out: Outbox = []
        for waiter in list(self._waiters):
            if self._passed(waiter):
                continue
            room = self.budget - self.leased
            if room < waiter.least:
                break
            self._waiters.remove(waiter)
            grant = min(waiter.want, room, self._share_room(waiter.client))
            self._add(waiter.client, grant)
            out.append((waiter.client, {"op": "granted", "id": waiter.id, "bytes": grant}))
        pressure = bool(self._waiters)
        if pressure != self._pressure:  # clients keep no idle slabs while someone waits
            self._pressure = pressure
            out += [(c, {"op": "pressure", "on": pressure}) for c in self.clients]
        return out
