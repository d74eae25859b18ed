"""A manager's lease from the node broker: the bytes it may hold, leased in slabs, given back when idle.

The account is handed a :class:`BrokerLease` and bounds its free memory by it; a batch the lease does
not cover asks for more (:meth:`BrokerLease.grow`, awaited in a scheduler's task, never on the request's
inline path). It connects on the first lease and again after the broker went away; it knows no manager.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import anyio

from .._errors import BrokerError, LeaseError
from .._stats import LeaseStatistics
from .channel import Channel, connect
from .protocol import VERSION, ProtocolError

__all__ = ["BrokerLease", "broker_status"]

log = logging.getLogger("aiocubie.broker")

#: Seconds to wait for the broker's welcome.
CONNECT_TIMEOUT = 5.0

Spawn = Callable[..., object]
#: How a read of the connection ends when the broker goes (or breaks the protocol).
_ENDS = (ProtocolError, anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


def _unreachable(path: str, exc: BaseException, role: str) -> BrokerError:
    if role == "status":  # a status reader holds no arrays and set no broker=
        return BrokerError(f"no broker answers at {path} ({exc}): is it the --socket the broker was started with?")
    return BrokerError(
        f"no broker answers at {path} ({exc}): start one with `python -m aiocubie broker --socket {path} "
        "--budget BYTES`, or drop broker= / AIOCUBIE_BROKER; the arrays held now stay valid"
    )


def _went_away(path: str) -> str:
    return (
        f"the broker at {path} went away; the arrays held now stay valid, and the next lease connects again once a "
        "broker serves that socket (restart it)"
    )


async def _connect(path: str, hello: dict[str, Any]) -> tuple[Channel, dict[str, Any]]:
    """Connect, say ``hello``, and return the channel and the broker's welcome."""
    try:
        with anyio.fail_after(CONNECT_TIMEOUT):
            channel = await connect(path)
    except (OSError, TimeoutError) as exc:
        raise _unreachable(path, exc, hello["role"]) from None
    try:
        with anyio.fail_after(CONNECT_TIMEOUT):
            channel.write(hello)
            answer = await channel.read()
    except BaseException as exc:
        channel.close()
        if isinstance(exc, TimeoutError | ProtocolError | OSError | anyio.EndOfStream | anyio.BrokenResourceError):
            raise BrokerError(f"the broker at {path} did not welcome this client: {exc!r}") from exc
        raise
    if answer["op"] == "refused" or answer.get("v") != VERSION:
        channel.close()
        reason = answer.get("reason") or f"the broker speaks protocol {answer.get('v')}, this client {VERSION}"
        raise BrokerError(f"the broker at {path} refused this client: {reason}; run one aiocubie version on the node")
    return channel, answer


async def broker_status(path: str) -> dict[str, Any]:
    """The record of the broker at ``path``: budget, leased, peak, clients and waiters.

    Raises
    ------
    BrokerError
        If no broker answers there, or it refuses this client.
    """
    hello = {"op": "hello", "v": VERSION, "role": "status", "pid": os.getpid(), "name": "status", "hold": 0}
    channel, _ = await _connect(path, hello)
    try:
        with anyio.fail_after(CONNECT_TIMEOUT):
            channel.write({"op": "status"})
            report = await channel.read()  # a large record waits in the socket: the broker sends it as it is read
    except (*_ENDS, TimeoutError) as exc:
        raise BrokerError(f"the broker at {path} went away, or did not answer: {exc!r}") from exc
    finally:
        channel.close()
    status: dict[str, Any] = report["status"]
    return status


class _Ask:
    __slots__ = ("done", "error", "granted")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.granted = 0
        self.error: Exception | None = None


class BrokerLease:
    """The bytes a manager may hold, leased from the node broker at ``path``.

    Parameters
    ----------
    path : str
        The broker's socket.
    spawn : callable
        ``spawn(async_fn, *args, name=...)`` starts a task of the manager (the connection's reader);
        returns False when the manager does not serve.
    name : str
        How the broker shows this client.
    """

    def __init__(self, path: str, spawn: Spawn, *, name: str = "") -> None:
        self.path = path
        self.granted = 0
        self._spawn = spawn
        self._name = name or os.path.basename(sys.argv[0] or "python")
        self._used: Callable[[], int] = lambda: 0
        self._changed: Callable[[], None] = lambda: None
        self._channel: Channel | None = None
        self._reader: anyio.CancelScope | None = None
        self._connecting = anyio.Lock()
        self._asks: dict[int, _Ask] = {}
        self._ids = itertools.count(1)
        self._slab = 0
        self._pressure = False
        self._reserved = 0  # granted to an ask whose batch has not been planned yet: not idle
        self._leases = 0
        self._returns = 0

    def bind(self, used: Callable[[], int], changed: Callable[[], None]) -> None:
        """Read the bytes held through ``used()``; call ``changed()`` whenever the lease moves."""
        self._used, self._changed = used, changed

    def statistics(self) -> LeaseStatistics:
        """The lease now (see :class:`~aiocubie.stats.LeaseStatistics`)."""
        return LeaseStatistics(
            self.path, self._channel is not None, self.granted, self._used(), self._slab, self._leases, self._returns
        )

    async def grow(self, least: int, want: int, *, wait: bool, priority: int = 0) -> int:
        """Lease at least ``least`` more bytes (``want`` rounded up to a slab if there is room); return the grant.

        ``wait``: wait for them (priority, then first come first served across the node's clients);
        else take what there is now.

        Raises
        ------
        LeaseError
            If not even ``least`` bytes are free now (not ``wait``).
        BrokerError
            If the broker cannot be reached, refuses this client, or goes away meanwhile.
        """
        channel = self._channel or await self._connected()
        slab = self._slab
        want = max(want, least, -(-want // slab) * slab if slab else want)
        id = next(self._ids)
        ask = self._asks[id] = _Ask()
        self._leases += 1
        try:
            # a write never awaits: the frame is out whole, and the reader takes the answer
            message = {"op": "lease", "id": id, "min": least, "want": want, "wait": wait, "priority": priority}
            if not self._write(channel, message):
                raise BrokerError(_went_away(self.path))
            await ask.done.wait()
        except BaseException:
            if not ask.done.is_set():
                self._write(channel, {"op": "cancel", "id": id})
            raise
        finally:
            del self._asks[id]
            self._reserved -= ask.granted  # the caller plans and allocates now, with no await between
        if ask.error is not None:
            raise ask.error
        return ask.granted

    def released(self) -> None:
        """Memory was freed: while another client waits, give the idle part of the lease back.

        Otherwise the lease stays at its high-water mark (the hysteresis: requests like the last
        ones need no round trip); a broker short of room asks for it (``pressure``, ``reclaim``).
        """
        if self._pressure:
            self._give_back()

    def _give_back(self) -> None:
        extra = self.granted - self._used() - self._reserved
        channel = self._channel
        if extra > 0 and channel is not None:
            self.granted -= extra
            self._returns += 1
            self._write(channel, {"op": "return", "bytes": extra})
            self._changed()

    def _write(self, channel: Channel, message: dict[str, Any]) -> bool:
        """Send ``message``; False if the broker went (it may be back: the next grow connects again)."""
        if self._channel is not channel:
            return False
        try:
            channel.write(message)
        except (anyio.BrokenResourceError, anyio.WouldBlock) as exc:
            self._lost(channel, exc)
            return False
        return True

    async def _connected(self) -> Channel:
        """The connection, made (again) if there is none."""
        async with self._connecting:
            if self._channel is not None:
                return self._channel
            hold = self._used()
            hello = {
                "op": "hello",
                "v": VERSION,
                "role": "client",
                "pid": os.getpid(),
                "name": self._name,
                "hold": hold,
            }
            channel, welcome = await _connect(self.path, hello)
            self._channel, self._slab, self.granted = channel, welcome["slab"], hold
            if not self._spawn(self._read, channel, name="aiocubie broker reader"):
                channel.close()
                self._channel = None
                raise BrokerError(f"leasing from the broker at {self.path} needs a running manager (async with)")
            log.info("leasing from the broker at %s (slab %d bytes)", self.path, self._slab)
            self._changed()
            return channel

    async def _read(self, channel: Channel) -> None:
        """Take the broker's messages (answers, pressure), sending what the socket did not take; until it goes."""
        try:
            async with anyio.create_task_group() as tasks:
                if self._channel is channel:
                    self._reader = tasks.cancel_scope  # _lost ends it
                tasks.start_soon(self._drain, channel)

                def take(message: dict[str, Any]) -> None:
                    if self._channel is channel:  # a connection lost takes nothing more
                        self._take(message)

                try:  # on asyncio each message is taken in the loop's callback: an answer wakes its grow
                    if self._channel is channel:  # else lost before this task started: nothing ends it
                        await channel.serve(take)
                except _ENDS as exc:
                    self._lost(channel, exc)
                tasks.cancel_scope.cancel()
        finally:
            self._lost(channel, None)
            channel.close()

    async def _drain(self, channel: Channel) -> None:
        try:
            await channel.drain()
        except anyio.BrokenResourceError as exc:
            self._lost(channel, exc)

    def _lost(self, channel: Channel, exc: BaseException | None) -> None:
        """The connection ended (``exc``: how, None when cancelled): keep only what is held; end the waits."""
        if self._channel is not channel:
            return
        gone = BrokerError(_went_away(self.path))
        if isinstance(exc, ProtocolError):
            gone = BrokerError(f"the broker at {self.path} broke the protocol: {exc}")
        if exc is not None:
            log.warning("%s", gone)
        self._channel, self._pressure = None, False
        if self._reader is not None:
            self._reader.cancel()  # the reader task, and its drain, end
            self._reader = None
        self.granted = self._used()  # slack is the broker's no longer; a new broker is told what is held
        for ask in self._asks.values():
            ask.error = gone
            ask.done.set()
        self._changed()  # the reader task closes the channel

    def _take(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "granted":
            self.granted += message["bytes"]
            ask = self._asks.get(message["id"])
            if ask is not None:
                ask.granted = message["bytes"]
                self._reserved += ask.granted
                ask.done.set()
            elif self._pressure:  # it crossed a cancel: idle, and someone waits
                self._give_back()
            self._changed()
        elif op == "denied":
            ask = self._asks.get(message["id"])
            if ask is not None:
                ask.error = LeaseError(f"the broker at {self.path}: {message['reason']}")
                ask.done.set()
        elif op == "pressure":
            self._pressure = message["on"]
            if self._pressure:
                self._give_back()
        elif op == "reclaim":
            self._give_back()
        elif op != "report":
            raise ProtocolError(f"a broker may not send {op!r}")
