"""A connection of frames over a raw non-blocking Unix socket: the broker's and its clients' I/O.

A write never awaits (a frame goes out whole, or what the socket does not take waits for
:meth:`Channel.drain`), so no cancellation can cut a frame; one task reads. Not anyio's streams:
each of their calls is a checkpoint, a loop turn each, and a round trip paid four of them. On
asyncio (and uvloop) :meth:`Channel.serve` keeps the socket registered with the loop and hands
each message over in the loop's own callback: no task wakes and no ``epoll_ctl`` runs per message
(benchmarks/bench_broker.py measures the round trip beside a raw socket echo). Knows no message.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Any, Final, NoReturn

import anyio
import anyio.lowlevel

from .protocol import HEADER, MAX_FRAME, ProtocolError, decode, encode

__all__ = ["Channel", "connect"]

#: Bytes a peer may leave unread before its writer is told to give up on it (see :meth:`Channel.write`).
BACKLOG: Final = 4 * MAX_FRAME
#: Bytes one recv takes: a turn of the loop a peer may hold (a flood of tiny frames: a few hundred of them, ~2 ms).
_CHUNK = 16384


class Channel:
    """Frames over ``sock`` (a connected Unix stream socket; made non-blocking here).

    Parameters
    ----------
    sock : socket.socket
        The connection; the channel owns it (:meth:`close`).
    backlog : int
        Bytes written but not taken by the socket beyond which :meth:`write` refuses.
    """

    __slots__ = ("_backlog", "_chunk", "_in", "_out", "_queued", "_served", "sock")

    def __init__(self, sock: socket.socket, *, backlog: int = BACKLOG) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._backlog = backlog
        self._in = bytearray()
        self._chunk = memoryview(bytearray(_CHUNK))  # recv_into it: no allocation a read
        self._out = bytearray()
        self._queued = anyio.Event()
        self._served: asyncio.Future[NoReturn] | None = None  # while serve() has the socket on asyncio's loop

    def write(self, message: dict[str, Any]) -> None:
        """Send ``message`` now, or queue what the socket does not take for :meth:`drain`.

        Raises
        ------
        anyio.BrokenResourceError
            If the connection is broken (the peer went).
        anyio.WouldBlock
            If the peer left more than the backlog unread (it does not read: give up on it).
        """
        frame = encode(message)
        if not self._out:
            try:
                sent = self.sock.send(frame)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise anyio.BrokenResourceError(f"the peer went: {exc}") from exc
            if sent == len(frame):
                return
            frame = frame[sent:]
        if len(self._out) + len(frame) > self._backlog:
            raise anyio.WouldBlock(f"the peer left {len(self._out)} bytes unread")
        self._out += frame
        self._queued.set()

    async def drain(self) -> None:
        """Send what :meth:`write` queued as the socket takes it; until cancelled, or the peer goes.

        Raises
        ------
        anyio.BrokenResourceError
            When the connection breaks.
        """
        while True:
            await self._queued.wait()
            self._queued = anyio.Event()
            while self._out:
                await anyio.wait_writable(self.sock)
                try:
                    sent = self.sock.send(self._out)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise anyio.BrokenResourceError(f"the peer went: {exc}") from exc
                del self._out[:sent]

    async def read(self) -> dict[str, Any]:
        """The next message, checked (waits for it; a cancelled read loses nothing).

        Raises
        ------
        ProtocolError
            For a frame over :data:`~aiocubie._broker.protocol.MAX_FRAME` or a message outside the protocol.
        anyio.EndOfStream
            When the peer closed the connection.
        anyio.BrokenResourceError
            When the connection broke.
        anyio.ClosedResourceError
            When the channel was closed meanwhile.
        """
        while (message := self._next()) is None:
            if self.sock.fileno() == -1:
                raise anyio.ClosedResourceError
            # each recv after a wait: a peer that floods yields the loop to the others at every read
            await anyio.wait_readable(self.sock)
            with contextlib.suppress(BlockingIOError):
                self._receive()
        return message

    async def serve(self, handle: Callable[[dict[str, Any]], object]) -> NoReturn:
        """Hand each message to ``handle`` as it comes, until the peer goes or ``handle`` raises (that ends it).

        On asyncio the socket stays registered with the loop, and ``handle`` runs in the loop's
        callback for it (so it must not await, and nothing it does may block); elsewhere a task reads
        each message. The same errors as :meth:`read`, and whatever ``handle`` raises.
        """
        loop = anyio.lowlevel.current_token().native_token  # (trio as asyncio's guest sees asyncio's running loop)
        if not isinstance(loop, asyncio.AbstractEventLoop):  # trio
            while True:
                handle(await self.read())
        while (message := self._next()) is not None:  # what read() left in the buffer
            handle(message)
        if self.sock.fileno() == -1:
            raise anyio.ClosedResourceError  # handle closed it
        served = self._served = loop.create_future()

        def readable() -> None:
            try:
                self._receive()  # one recv a callback: a peer that floods lets the others' callbacks run
                while not served.done() and (message := self._next()) is not None:
                    handle(message)
            except BlockingIOError:
                pass
            except BaseException as exc:  # the connection ends: the task awaiting serve() raises it
                if not served.done():
                    served.set_exception(exc)  # a KeyboardInterrupt too, as a task's own raise would
                elif not isinstance(exc, Exception):
                    raise  # serve() has ended: the loop's run raises it

        loop.add_reader(self.sock, readable)
        try:
            await served
        finally:
            if self._served is served:
                self._served = None
                loop.remove_reader(self.sock)
        raise AssertionError("unreachable: served ends only with an exception")  # pragma: no cover

    def _next(self) -> dict[str, Any] | None:
        """The next whole message in the buffer, checked; None until one is."""
        buffer = self._in
        if len(buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(buffer)
        if length > MAX_FRAME:
            raise ProtocolError(f"a frame of {length} bytes is over the limit of {MAX_FRAME}")
        end = HEADER.size + length
        if len(buffer) < end:
            return None
        body = bytes(buffer[HEADER.size : end])
        del buffer[:end]
        return decode(body)

    def _receive(self) -> None:
        """Take what the socket holds into the buffer (one recv; BlockingIOError when nothing)."""
        try:
            count = self.sock.recv_into(self._chunk)
        except BlockingIOError:
            raise
        except OSError as exc:
            raise anyio.BrokenResourceError(f"the peer went: {exc}") from exc
        if not count:
            raise anyio.EndOfStream
        self._in += self._chunk[:count]

    def close(self) -> None:
        """Close the socket, dropping what it read; a task waiting on it, or reading next, gets ClosedResourceError."""
        self._in.clear()  # a handler that closes it is handed nothing more
        served, self._served = self._served, None
        if served is not None:
            served.get_loop().remove_reader(self.sock)
            if not served.done():
                served.set_exception(anyio.ClosedResourceError())
        if self.sock.fileno() != -1:
            anyio.notify_closing(self.sock)
        self.sock.close()


async def connect(path: str) -> Channel:
    """A channel to the Unix socket at ``path``.

    Raises
    ------
    OSError
        If nothing listens there.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        while True:
            try:
                sock.connect(path)
                break
            except BlockingIOError:  # the listener's backlog is full: a Unix socket says try again
                await anyio.sleep(0.001)
    except BaseException:
        sock.close()
        raise
    return Channel(sock)
