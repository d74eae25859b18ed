"""The broker: a Unix socket serving one device's node budget to the managers of a node.

Each connection is one client (a manager) or a status reader. Every message is checked by the
protocol before the record (:class:`~aiocubie._broker.leases.Leases`) sees it; a peer that breaks
the protocol, or belongs to another user, is logged and disconnected, and nothing it sends reaches
another client. It never imports the manager.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .._errors import BrokerError
from .channel import Channel
from .leases import Client, Leases, Outbox
from .protocol import VERSION, ProtocolError

__all__ = ["Broker", "peer_credentials", "prepare_socket"]

log = logging.getLogger("aiocubie.broker")

#: Seconds a peer has to say hello.
HELLO_TIMEOUT = 5.0
#: The longest path a Unix socket binds to (sun_path: 108 bytes on Linux, 104 elsewhere, less the NUL).
PATH_MAX = 107 if sys.platform.startswith("linux") else 103


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """The (pid, uid, gid) of the process at the other end (Linux's SO_PEERCRED; None elsewhere)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return pid, uid, gid


def prepare_socket(path: Path) -> None:
    """Make ``path``'s directory owner-only (creating it 0700) and clear a stale socket.

    Raises
    ------
    BrokerError
        If the directory is another user's or open to others, or a broker answers at ``path``.
    """
    folder = path.parent
    if len(os.fsencode(path)) > PATH_MAX:
        raise BrokerError(
            f"the broker's socket path {path} is {len(os.fsencode(path))} bytes long; a Unix socket's is at most "
            f"{PATH_MAX}: use a shorter one, such as /tmp/aiocubie-{os.getuid()}/broker.sock"
        )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        mine = info.st_uid == os.getuid() and not info.st_mode & stat.S_ISVTX  # not a shared one such as /tmp
        raise BrokerError(
            f"the broker's socket goes in a directory only you can open; {folder} has mode "
            f"{stat.filemode(info.st_mode)} (owner uid {info.st_uid}): use a new one, such as "
            f"{folder / f'aiocubie-{os.getuid()}' / path.name} (the broker makes it, mode 0700)"
            + (f", or chmod 700 {folder}" if mine else "")
        )
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # a socket left by a broker that died
        else:
            raise BrokerError(f"a broker already serves {path}: stop it first, or use another --socket")
        finally:
            probe.close()


class Broker:
    """The node broker of one device.

    Parameters
    ----------
    path : str or Path
        The Unix socket to serve (mode 0600, in a directory of mode 0700).
    budget : int
        The bytes the device's clients may lease together.
    slab : int, optional
        The bytes clients lease at a time (default: 1/32 of the budget, at least 4 KiB).
    device : int
        The device the budget is of (told to clients).
    allowed_uid : int, optional
        The user whose processes may connect (default: the broker's own user).
    split : int
        Split the budget into this many equal shares: one process's clients together lease at most
        one (``pytest -n N``: one a worker). Default 1: a process may lease the whole budget.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        budget: int,
        *,
        slab: int | None = None,
        device: int = 0,
        allowed_uid: int | None = None,
        split: int = 1,
    ) -> None:
        if budget < 1:
            raise BrokerError(f"the broker's budget must be at least 1 byte, got {budget}")
        if not 1 <= split <= budget:
            raise BrokerError(f"the broker's budget of {budget} bytes cannot be split {split} ways: give 1 to {budget}")
        self.path = Path(path)
        self.leases = Leases(budget, budget // split)
        if slab is not None and not 1 <= slab <= budget:
            raise BrokerError(
                f"the broker's slab of {slab} bytes must be 1 to its budget of {budget}: give a smaller --slab"
            )
        self.slab = slab if slab is not None else max(4096, budget // 32 // 4096 * 4096)
        self.device = device
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self._channels: dict[Client, tuple[Channel, anyio.CancelScope]] = {}

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; the socket is removed at the end."""
        prepare_socket(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mask = os.umask(0o177)  # the socket is born 0600: no moment when another user may connect
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(mask)
        log.info(
            "broker on %s: budget %d bytes (a process's share %d), slab %d, device %d",
            self.path,
            self.leases.budget,
            self.leases.share,
            self.slab,
            self.device,
        )
        try:
            with listener:
                listener.listen(128)
                listener.setblocking(False)
                async with anyio.create_task_group() as connections:
                    task_status.started()
                    while True:
                        # (not anyio's listener: on asyncio its accept logs an error when cancelled as a peer knocks)
                        await anyio.wait_readable(listener)
                        try:
                            peer, _ = listener.accept()
                        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                            continue
                        connections.start_soon(self._connection, Channel(peer))
        finally:
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def _connection(self, channel: Channel) -> None:
        """One peer, from hello to goodbye; whatever it does, the broker and the others go on."""
        peer = peer_credentials(channel.sock)
        who = f"pid {peer[0]}" if peer else "a peer"
        try:
            try:
                if peer is not None and peer[1] != self.allowed_uid:
                    log.warning("%s of uid %d refused: the broker serves uid %d", who, peer[1], self.allowed_uid)
                    channel.write({"op": "refused", "v": VERSION, "reason": f"uid {peer[1]} is not served here"})
                    return
                with anyio.fail_after(HELLO_TIMEOUT):
                    hello = await channel.read()
                if hello["op"] != "hello":
                    raise ProtocolError(f"the first message must be hello, got {hello['op']!r}")
                if hello["v"] != VERSION:
                    reason = f"this broker speaks protocol {VERSION}, the client {hello['v']}"
                    log.warning("%s refused: %s", who, reason)
                    channel.write({"op": "refused", "v": VERSION, "reason": reason})
                    return
                if hello["role"] == "status":
                    await self._session(channel, None, lambda: self._report(channel))
                    return
                client = Client(
                    hello["pid"] if peer is None else peer[0], None if peer is None else peer[1], hello["name"]
                )
                await self._serve_client(channel, client, hello["hold"])
            finally:
                channel.close()
        except ProtocolError as exc:
            log.warning("%s broke the protocol (%s): connection closed", who, exc)
        except TimeoutError:
            log.warning("%s said no hello within %g s: connection closed", who, HELLO_TIMEOUT)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.WouldBlock, OSError):
            pass  # the peer left, or did not read
        except Exception:  # a bug: this connection ends, the broker goes on
            log.exception("%s: unexpected error; connection closed", who)

    async def _session(self, channel: Channel, client: Client | None, serve: Callable[[], Awaitable[None]]) -> None:
        """Welcome the peer and ``serve()`` it, sending what its channel queued meanwhile; until either ends."""
        error: Exception | None = None  # raised outside the task group: not wrapped in an ExceptionGroup
        channel.write(self._welcome())  # here too: a peer gone already is not an ExceptionGroup
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._drain, channel, tasks.cancel_scope)
            if client is not None:
                self._channels[client] = channel, tasks.cancel_scope
            try:
                await serve()
            except Exception as exc:
                error = exc
            tasks.cancel_scope.cancel()
        if error is not None:
            raise error

    @staticmethod
    async def _drain(channel: Channel, scope: anyio.CancelScope) -> None:
        with contextlib.suppress(anyio.BrokenResourceError):
            await channel.drain()
        scope.cancel()  # the peer left: end the connection

    async def _report(self, channel: Channel) -> None:
        """A status reader: answer each ``status`` with the record."""

        def answer(message: dict[str, Any]) -> None:
            if message["op"] != "status":
                raise ProtocolError(f"a status reader may only ask status, got {message['op']!r}")
            channel.write({"op": "report", "status": self.status()})

        await channel.serve(answer)

    def _welcome(self) -> dict[str, Any]:
        return {"op": "welcome", "v": VERSION, "budget": self.leases.budget, "slab": self.slab, "device": self.device}

    def status(self) -> dict[str, Any]:
        """The record (see :meth:`Leases.status`) with the socket, slab and device."""
        return {**self.leases.status(), "socket": str(self.path), "slab": self.slab, "device": self.device}

    async def _serve_client(self, channel: Channel, client: Client, hold: int) -> None:
        joined = self.leases.join(client, hold)
        log.info("client pid %d (%s) joined holding %d bytes", client.pid, client.name, hold)
        stopping = False
        try:
            await self._session(channel, client, lambda: self._read(channel, client, joined))
        except anyio.get_cancelled_exc_class():
            stopping = True  # the broker stops: nothing goes out to the others on its way down
            raise
        finally:
            self._channels.pop(client, None)
            left = self.leases.leave(client)
            if not stopping:
                self._post(left)
            log.info("client pid %d left; its lease is back", client.pid)

    async def _read(self, channel: Channel, client: Client, joined: Outbox) -> None:
        self._post(joined)
        # each message is answered as it is read (on asyncio in the loop's callback): no task between
        await channel.serve(lambda message: self._post(self._answer(client, message)))

    def _answer(self, client: Client, message: dict[str, Any]) -> Outbox:
        op = message["op"]
        if op == "lease":
            return self.leases.ask(
                client, message["id"], message["min"], message["want"], message["wait"], message["priority"]
            )
        if op == "cancel":
            return self.leases.cancel(client, message["id"])
        if op == "return":
            return self.leases.give_back(client, message["bytes"])
        if op == "status":
            return [(client, {"op": "report", "status": self.status()})]
        raise ProtocolError(f"a client may not send {op!r}")

    def _post(self, out: Outbox) -> None:
        """Send each message to its client; a client gone, or too slow to read, is disconnected."""
        for client, message in out:
            connection = self._channels.get(client)
            if connection is None:
                continue
            channel, scope = connection
            try:
                channel.write(message)
            except anyio.WouldBlock:
                log.warning("client pid %d does not read its messages: disconnected", client.pid)
                scope.cancel()
            except anyio.BrokenResourceError:
                scope.cancel()
