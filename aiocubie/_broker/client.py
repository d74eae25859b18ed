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
import anyio.abc

from .._errors import BrokerError, LeaseError
from .._stats import LeaseStatistics
from .protocol import VERSION, ProtocolError, encode, receive, send

__all__ = ["BrokerLease", "broker_status"]

log = logging.getLogger("aiocubie.broker")

#: Seconds to wait for the broker's welcome.
CONNECT_TIMEOUT = 5.0

Spawn = Callable[..., object]
#: How a read of the connection ends when the broker goes (or breaks the protocol).
_ENDS = (ProtocolError, anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


def _unreachable(path: str, exc: BaseException) -> BrokerError:
    return BrokerError(
        f"no broker answers at {path} ({exc}): start one with `python -m aiocubie broker --socket {path} "
        "--budget BYTES`, or drop broker= / AIOCUBIE_BROKER; the arrays held now stay valid"
    )


async def _connect(path: str, hello: dict[str, Any]) -> tuple[anyio.abc.SocketStream, bytearray, dict[str, Any]]:
    """Connect, say ``hello``, and return the stream, its buffer and the broker's welcome."""
    try:
        stream = await anyio.connect_unix(path)
    except OSError as exc:
        raise _unreachable(path, exc) from None
    buffer = bytearray()
    try:
        with anyio.fail_after(CONNECT_TIMEOUT):
            await send(stream, hello)
            answer = await receive(stream, buffer)
    except BaseException as exc:
        await anyio.aclose_forcefully(stream)
        if isinstance(exc, TimeoutError | ProtocolError | OSError | anyio.EndOfStream | anyio.BrokenResourceError):
            raise BrokerError(f"the broker at {path} did not welcome this client: {exc!r}") from exc
        raise
    if answer["op"] == "refused" or answer.get("v") != VERSION:
        await anyio.aclose_forcefully(stream)
        reason = answer.get("reason") or f"the broker speaks protocol {answer.get('v')}, this client {VERSION}"
        raise BrokerError(f"the broker at {path} refused this client: {reason}; run one aiocubie version on the node")
    return stream, buffer, answer


async def broker_status(path: str) -> dict[str, Any]:
    """The record of the broker at ``path``: budget, leased, peak, clients and waiters.

    Raises
    ------
    BrokerError
        If no broker answers there, or it refuses this client.
    """
    hello = {"op": "hello", "v": VERSION, "role": "status", "pid": os.getpid(), "name": "status", "hold": 0}
    stream, buffer, _ = await _connect(path, hello)
    async with stream:
        await send(stream, {"op": "status"})
        report = await receive(stream, buffer)
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
        ``spawn(async_fn, *args, name=...)`` starts a task of the manager (the connection's reader,
        a return of idle slabs); returns False when the manager does not serve.
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
        self._stream: anyio.abc.SocketStream | None = None
        self._connecting = anyio.Lock()
        self._sending = anyio.Lock(fast_acquire=True)  # one frame at a time on the stream (no checkpoint when free)
        # who receives: the reader task, parked in a receive while no grow waits; a grow takes the socket
        # (cancelling the parked receive, which loses nothing) and reads its answer inline: no task hop
        self._reading = anyio.Lock()
        self._parked: anyio.CancelScope | None = None
        self._inline = False  # a grow reads (or is about to); other grows wait for their answer
        self._buffer = bytearray()
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
            self.path, self._stream is not None, self.granted, self._used(), self._slab, self._leases, self._returns
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
        stream = await self._connected()
        slab = self._slab
        want = max(want, least, -(-want // slab) * slab if slab else want)
        id = next(self._ids)
        ask = self._asks[id] = _Ask()
        self._leases += 1
        try:
            if self._stream is not stream:  # the broker went between the connection and now
                raise BrokerError(f"the broker at {self.path} went away; the arrays held now stay valid")
            await self._send({"op": "lease", "id": id, "min": least, "want": want, "wait": wait, "priority": priority})
            if self._inline or ask.done.is_set():
                await ask.done.wait()  # another grow reads, or the reader task: it answers this one too
            else:
                await self._read_inline(stream, ask)
        except BaseException:
            if not ask.done.is_set() and self._stream is stream:
                with anyio.CancelScope(shield=True):
                    await self._send({"op": "cancel", "id": id})
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
        # not serving (the manager is closing): nothing can be sent; the lease ends with the connection
        message = {"op": "return", "bytes": extra}
        if extra > 0 and self._stream is not None and self._spawn(self._send, message, name="aiocubie broker return"):
            self.granted -= extra
            self._returns += 1
            self._changed()

    async def _send(self, message: dict[str, Any]) -> None:
        stream = self._stream
        if stream is None:
            return
        try:
            async with self._sending:
                await stream.send(encode(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the reader sees the broker go

    async def _read_inline(self, stream: anyio.abc.SocketStream, ask: _Ask) -> None:
        """Read the socket in this task until ``ask`` is answered; the reader task waits meanwhile."""
        self._inline = True
        try:
            if self._parked is not None:
                self._parked.cancel()  # after the send: the reader steps aside while the answer is on its way
            async with self._reading:
                try:
                    while not ask.done.is_set():
                        self._take(await receive(stream, self._buffer))
                except _ENDS as exc:
                    self._lost(stream, exc)
        finally:
            self._inline = False

    async def _connected(self) -> anyio.abc.SocketStream:
        """The connection, made (again) if there is none."""
        if self._stream is not None:  # the usual case: no lock, no checkpoint (the send is one)
            return self._stream
        async with self._connecting:
            if self._stream is not None:
                return self._stream
            hold = self._used()
            hello = {
                "op": "hello",
                "v": VERSION,
                "role": "client",
                "pid": os.getpid(),
                "name": self._name,
                "hold": hold,
            }
            stream, buffer, welcome = await _connect(self.path, hello)
            self._stream, self._slab, self.granted, self._buffer = stream, welcome["slab"], hold, buffer
            if not self._spawn(self._read, stream, name="aiocubie broker reader"):
                await anyio.aclose_forcefully(stream)
                self._stream = None
                raise BrokerError(f"leasing from the broker at {self.path} needs a running manager (async with)")
            log.info("leasing from the broker at %s (slab %d bytes)", self.path, self._slab)
            self._changed()
            return stream

    async def _read(self, stream: anyio.abc.SocketStream) -> None:
        """Take the broker's messages while no grow reads, until it goes; then end the waits."""
        try:
            async with stream:
                while self._stream is stream:
                    async with self._reading:
                        if self._inline or self._stream is not stream:
                            continue  # a grow is about to read: let it have the socket (or the end came)
                        message = None
                        with anyio.CancelScope() as self._parked:
                            message = await receive(stream, self._buffer)  # a cancelled receive loses nothing
                        self._parked = None
                        if message is not None:
                            self._take(message)
        except _ENDS as exc:
            self._lost(stream, exc)
        finally:
            self._lost(stream, None)

    def _lost(self, stream: anyio.abc.SocketStream, exc: BaseException | None) -> None:
        """The connection ended (``exc``: how, None when cancelled): keep only what is held; end the waits."""
        if self._stream is not stream:
            return
        gone = BrokerError(f"the broker at {self.path} went away; the arrays held now stay valid")
        if isinstance(exc, ProtocolError):
            gone = BrokerError(f"the broker at {self.path} broke the protocol: {exc}")
        if exc is not None:
            log.warning("%s", gone)
        self._stream, self._pressure = None, False
        self.granted = self._used()  # slack is the broker's no longer; a new broker is told what is held
        for ask in self._asks.values():
            ask.error = gone
            ask.done.set()
        self._changed()  # the reader task closes the stream

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
