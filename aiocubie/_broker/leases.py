"""The broker's record: the node budget, each client's lease, and the clients waiting for one.

Pure bookkeeping: it is told what a client asks and returns, and answers with the messages to send
(to whom); it does no I/O and knows no socket. Waiters are served by priority, then first come
first served, and never skipped: bytes that come free go to the head of the line first.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import attrs

from .._stats import format_bytes

__all__ = ["Client", "Leases", "Outbox"]

#: The messages to send: (client, message) pairs, in order.
Outbox = list[tuple["Client", dict[str, Any]]]


@attrs.define(eq=False)
class Client:
    """One connected manager: who it is and what it holds."""

    pid: int
    uid: int | None
    name: str
    lease: int = 0


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

    Attributes
    ----------
    leased : int
        Bytes leased now, every client together.
    peak : int
        The most ever leased at once (the record a test checks against the budget).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.clients: list[Client] = []
        self.leased = 0
        self.peak = 0
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._pressure = False

    def join(self, client: Client, hold: int) -> Outbox:
        """``client`` connected, holding ``hold`` bytes already (it reconnects after a broker restart)."""
        self.clients.append(client)
        self._add(client, hold)
        return [(client, {"op": "pressure", "on": True})] if self._pressure else []

    def leave(self, client: Client) -> Outbox:
        """``client``'s connection closed: its lease and its waits end; serve who waits."""
        if client in self.clients:
            self.clients.remove(client)
        self._waiters = [w for w in self._waiters if w.client is not client]
        self.leased -= client.lease
        client.lease = 0
        return self._serve()

    def ask(self, client: Client, id: int, least: int, want: int, wait: bool, priority: int) -> Outbox:
        """``client`` asks for at least ``least`` bytes more, ``want`` if it can (request ``id``).

        Granted at once when there is room beside what the waiters before it need; otherwise it
        waits (``wait``) or is denied, with what the other clients hold.
        """
        if wait:
            # never more than the budget could give it: a batch larger than the node waits for all of it
            least = max(0, min(least, self.budget - client.lease))
            self._waiters.append(_Waiter(client, id, least, want, priority, next(self._seq), time.monotonic()))
            self._waiters.sort(key=lambda w: (-w.priority, w.seq))
            return self._serve()
        room = self.budget - self.leased - (self._waiters[0].least if self._waiters else 0)  # the head goes first
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
        nbytes = min(nbytes, client.lease)
        client.lease -= nbytes
        self.leased -= nbytes
        return self._serve()

    def why(self, client: Client, least: int) -> str:
        """Why ``least`` bytes cannot be leased to ``client`` now: the budget and who holds it."""
        others = [c for c in self.clients if c is not client and c.lease]
        held = ", ".join(f"pid {c.pid}{f' ({c.name})' if c.name else ''} {format_bytes(c.lease)}" for c in others)
        return (
            f"{format_bytes(least)} more cannot be leased: {format_bytes(self.leased)} of the node budget of "
            f"{format_bytes(self.budget)} is leased (this client {format_bytes(client.lease)}; others: "
            f"{held or 'none'}), {len(self._waiters)} waiting"
        )

    def status(self) -> dict[str, Any]:
        """The record as plain data: budget, leased, peak, clients and waiters."""
        now = time.monotonic()
        return {
            "budget": self.budget,
            "leased": self.leased,
            "peak": self.peak,
            "clients": [{"pid": c.pid, "uid": c.uid, "name": c.name, "lease": c.lease} for c in self.clients],
            "waiters": [
                {"pid": w.client.pid, "least": w.least, "priority": w.priority, "waited": round(now - w.since, 3)}
                for w in self._waiters
            ],
        }

    def _add(self, client: Client, nbytes: int) -> None:
        client.lease += nbytes
        self.leased += nbytes
        self.peak = max(self.peak, self.leased)

    def _serve(self) -> Outbox:
        """Grant the waiters at the head of the line while there is room; say when pressure starts or ends."""
        out: Outbox = []
        while self._waiters:
            head = self._waiters[0]
            room = self.budget - self.leased
            if room < head.least:
                break
            self._waiters.pop(0)
            grant = min(head.want, room)
            self._add(head.client, grant)
            out.append((head.client, {"op": "granted", "id": head.id, "bytes": grant}))
        pressure = bool(self._waiters)
        if pressure != self._pressure:  # clients keep no idle slabs while someone waits
            self._pressure = pressure
            out += [(c, {"op": "pressure", "on": pressure}) for c in self.clients]
        return out
