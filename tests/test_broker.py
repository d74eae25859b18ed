"""The node broker (issue 34): protocol, leases, policies across managers, faults, security, a storm.

In-process tests run a :class:`Broker` in the test's loop (asyncio, trio, uvloop); the fault and storm
tests run real processes (``tests/brokerkit.py``): a broker, clients, one killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket as sockets
import stat
import struct
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from brokerkit import DEVICE, MiB, broker, spawn, status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiocubie import ArrayRequest, MemoryManager
from aiocubie._broker.channel import Channel
from aiocubie._broker.client import broker_status
from aiocubie._broker.leases import Client, Leases
from aiocubie._broker.protocol import MAX_FRAME, VERSION, ProtocolError, check, decode, encode
from aiocubie._broker.server import Broker, prepare_socket
from aiocubie.errors import BrokerError, LeaseError, UnchunkableTooLargeError
from aiocubie.simulator import SimulatorBackend


@pytest.fixture(params=["asyncio", "trio", pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    if request.param != "asyncio" and request.param != "trio":
        pytest.importorskip("uvloop")
    return request.param


@pytest.fixture
def where(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A socket path in a fresh owner-only directory (short: a Unix socket's path is at most 107 bytes)."""
    folder = Path(f"/tmp/aiocubie-test-{os.getpid()}-{time.monotonic_ns()}")
    yield folder / "broker.sock"
    with contextlib.suppress(OSError):
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()


@contextlib.asynccontextmanager
async def serving(path: Path, budget: int, **options: object) -> AsyncIterator[Broker]:
    served = Broker(path, budget, **options)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tasks:
        await tasks.start(served.serve)
        yield served
        tasks.cancel_scope.cancel()


def block(nbytes: int) -> dict[str, ArrayRequest]:
    """``nbytes`` as float32 runs along a chunkable axis."""
    return {"x": ArrayRequest((nbytes // 4,), "float32", chunk_axis=0)}


# -- the protocol -----------------------------------------------------------------------------
messages = st.one_of(
    st.builds(
        lambda i, m, w, p: {"op": "lease", "id": i, "min": m, "want": m + w, "wait": p % 2 == 0, "priority": p},
        st.integers(0, 2**40),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
        st.integers(-100, 100),
    ),
    st.builds(lambda i: {"op": "cancel", "id": i}, st.integers(0, 2**61)),
    st.builds(
        lambda n, t: {"op": "hello", "v": VERSION, "role": "client", "pid": 1, "name": t, "hold": n},
        st.integers(0, 2**50),
        st.text(max_size=30),
    ),
)


@given(messages)
def test_a_message_survives_its_frame(message: dict[str, object]) -> None:
    frame = encode(message)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    assert decode(frame[4:]) == message


@pytest.mark.parametrize(
    ("message", "why"),
    [
        ([1, 2], "JSON object"),
        ({"op": "steal"}, "unknown op"),
        ({"op": 7}, "unknown op"),
        ({"op": "cancel", "id": "1"}, "must be int"),
        ({"op": "cancel", "id": True}, "must be int, got bool"),
        ({"op": "cancel", "id": -1}, "out of range"),
        ({"op": "return", "bytes": 2**70}, "out of range"),
        ({"op": "lease", "id": 1, "min": 9, "want": 1, "wait": False, "priority": 0}, "over want"),
        ({"op": "hello", "v": 1, "role": "root", "pid": 1, "name": "", "hold": 0}, "role"),
    ],
)
def test_a_message_outside_the_protocol_is_refused(message: object, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        check(message)


def test_the_record_serves_priority_then_first_come() -> None:
    leases = Leases(100)
    a, b, c, d = (Client(pid, 0, name) for pid, name in enumerate("abcd"))
    for client in (a, b, c, d):
        leases.join(client, 0)
    assert leases.ask(a, 1, 100, 100, False, 0)[0][1]["op"] == "granted"
    out = leases.ask(b, 1, 10, 10, True, 0) + leases.ask(c, 1, 10, 10, True, 0) + leases.ask(d, 1, 10, 10, True, 5)
    assert [m["op"] for _, m in out] == ["pressure"] * 4  # a waiter: every client keeps no idle slab
    served = leases.give_back(a, 20)
    assert [(client.name, m["op"]) for client, m in served] == [("d", "granted"), ("b", "granted")]
    assert leases.status()["waiters"][0]["pid"] == c.pid
    assert leases.peak == leases.budget == leases.leased


def test_a_refusal_names_what_the_others_hold() -> None:
    leases = Leases(64 * MiB)
    holder, asker = Client(11, 0, "trainer"), Client(12, 0, "")
    leases.join(holder, 48 * MiB)
    leases.join(asker, 0)
    (_, answer), (reclaimed, reclaim) = leases.ask(asker, 3, 32 * MiB, 32 * MiB, False, 0)
    assert answer["op"] == "denied" and reclaimed is holder and reclaim == {"op": "reclaim"}
    assert "pid 11 (trainer) 48.0 MiB" in answer["reason"] and "64.0 MiB" in answer["reason"]
    assert answer["reason"].endswith("policy 'wait' waits for them, 'chunk' takes what there is")
    (_, answer), *_ = leases.ask(asker, 4, 65 * MiB, 65 * MiB, False, 0)
    assert answer["reason"].endswith("more than the node budget: a larger --budget, or policy 'chunk'")
    leases.leave(holder)
    assert leases.leased == 0 and leases.clients == [asker]


def test_a_process_leases_at_most_its_share_and_the_line_goes_on_past_it() -> None:
    leases = Leases(100, share=50)
    a1, a2, b, c = Client(1, 0, "a1"), Client(1, 0, "a2"), Client(2, 0, "b"), Client(3, 0, "c")  # a1, a2: one process
    for client in (a1, a2, b, c):
        leases.join(client, 0)
    assert leases.ask(a1, 1, 10, 40, False, 0)[0][1] == {"op": "granted", "id": 1, "bytes": 40}
    (_, answer), *_ = leases.ask(a2, 1, 20, 20, False, 0)  # the node has 60 free, its process 10
    assert answer["op"] == "denied" and "this process holds 40 B of its share of 50 B" in answer["reason"]
    (_, answer), *_ = leases.ask(a2, 9, 60, 60, False, 0)
    assert answer["reason"].endswith("more than a process's share: a smaller --split, or policy 'chunk'")
    assert [m["op"] for _, m in leases.ask(a2, 2, 20, 20, True, 9)] == ["pressure"] * 4  # first in line
    # a2 waits for its own process, not the node: the line goes on past it, and asks past it are granted
    assert leases.ask(c, 1, 10, 10, True, 0) == [(c, {"op": "granted", "id": 1, "bytes": 10})]
    assert leases.ask(b, 1, 10, 80, False, 0)[0][1] == {"op": "granted", "id": 1, "bytes": 50}  # its share
    assert next(m for _, m in leases.give_back(a1, 40)) == {"op": "granted", "id": 2, "bytes": 20}
    status = leases.status()
    assert status["share"] == 50 and status["peak"] == 100 and leases.leased == 80
    assert {p["pid"]: (p["lease"], p["peak"]) for p in status["processes"]} == {1: (20, 40), 2: (50, 50), 3: (10, 10)}
    for client in (a1, a2):
        leases.leave(client)
    assert {p["pid"]: (p["lease"], p["clients"]) for p in leases.status()["processes"]}[1] == (0, 0)  # kept, gone


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 60), st.booleans()), max_size=80))
@settings(max_examples=300, deadline=None)
def test_the_record_never_leases_over_the_budget_or_a_share_and_serves_every_waiter_in_the_end(
    steps: list[tuple[int, int, int, bool]],
) -> None:
    """Random asks (waiting or not), give-backs and leaves of six managers in three processes."""
    leases = Leases(100, share=60)
    clients = [Client(pid, 0, str(i)) for i, pid in enumerate((1, 1, 2, 2, 3, 3))]
    for client in clients:
        leases.join(client, 0)
    waiting: dict[int, Client] = {}
    for index, (who, what, nbytes, wait) in enumerate(steps):
        client = clients[who]
        if what == 0 and client in leases.clients:
            out = leases.ask(client, index, nbytes, nbytes + 5, wait, index % 3)
            waiting[index] = client
        elif what == 1:
            out = leases.give_back(client, nbytes)
        elif what == 2 and client in leases.clients and len(leases.clients) > 1:
            out = leases.leave(client)
            waiting = {i: c for i, c in waiting.items() if c is not client}
        else:
            continue
        for _, message in out:
            if message["op"] in ("granted", "denied"):
                waiting.pop(message["id"])
        held: dict[int, int] = {}
        for each in leases.clients:
            held[each.pid] = held.get(each.pid, 0) + each.lease
        assert leases.leased == sum(held.values()) <= leases.peak <= leases.budget
        assert all(lease <= leases.share for lease in held.values()), held
        assert {p["pid"]: p["lease"] for p in leases.status()["processes"] if p["clients"]} == held
    for _ in range(len(clients)):  # everyone gives everything back, again and again: every waiter is served
        for client in list(leases.clients):
            for _, message in leases.give_back(client, client.lease):
                if message["op"] == "granted":
                    waiting.pop(message["id"])
    assert not waiting, leases.status()


# -- the channel ------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_served_channel_hands_over_each_message_and_ends_as_its_peer_does() -> None:
    """serve() takes frames cut anywhere, in order, and ends with the end: the peer's close, a handler's error, close()."""
    frames = b"".join(encode({"op": "cancel", "id": i}) for i in range(50))
    ends: list[type[BaseException]] = []
    for end in ("peer closes", "handler raises", "closed here"):
        mine, theirs = sockets.socketpair()
        channel, got = Channel(mine), []

        def handle(message: dict[str, object], end: str = end) -> None:
            got.append(message["id"])
            if end == "handler raises" and len(got) == 30:
                raise ProtocolError("thirty is enough")

        async def feed(end: str = end) -> None:
            for start in range(0, len(frames), 7):  # 7 bytes at a time: headers and bodies cut
                theirs.send(frames[start : start + 7])
                await anyio.sleep(0)
            await anyio.sleep(0.05)
            if end == "closed here":
                channel.close()
            theirs.close()

        with theirs, anyio.fail_after(10):
            try:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(feed)
                    await channel.serve(handle)
            except Exception as exc:  # which one is the point
                ends.append(type(exc.exceptions[0] if isinstance(exc, ExceptionGroup) else exc))
        channel.close()
        assert got == list(range(30 if end == "handler raises" else 50))
    assert ends == [anyio.EndOfStream, ProtocolError, anyio.ClosedResourceError]


def _frames(ids: range) -> bytes:
    return b"".join(encode({"op": "cancel", "id": i}) for i in ids)


class _Interrupt(BaseException):
    """Not an Exception, as KeyboardInterrupt and SystemExit are not."""


@pytest.mark.anyio
async def test_a_handler_s_base_exception_ends_its_serve() -> None:
    """A BaseException from the handler ends serve() with it on every loop (on asyncio it was only logged: a hang)."""
    mine, theirs = sockets.socketpair()
    channel, got = Channel(mine), []

    def handle(message: dict[str, object]) -> None:
        got.append(message["id"])
        if len(got) == 3:
            raise _Interrupt

    with theirs, anyio.fail_after(5), pytest.raises(_Interrupt):
        theirs.send(_frames(range(9)))
        await channel.serve(handle)
    channel.close()
    assert got == [0, 1, 2]


@pytest.mark.anyio
@pytest.mark.parametrize("when", ["buffered before serve", "arriving while served"])
async def test_a_handler_that_closes_its_channel_is_handed_nothing_more(when: str) -> None:
    """close() in the handler ends serve() with ClosedResourceError, the frames behind it unhanded, on every loop."""
    mine, theirs = sockets.socketpair()
    channel, got, ends = Channel(mine), [], []

    def handle(message: dict[str, object]) -> None:
        got.append(message["id"])
        if len(got) == 3:
            channel.close()

    async def serve() -> None:
        try:
            await channel.serve(handle)
        except Exception as exc:  # which one is the point
            ends.append(exc)

    with theirs, anyio.fail_after(5):
        if when == "buffered before serve":
            theirs.send(_frames(range(9)))
            assert (await channel.read())["id"] == 0  # one recv took them all: eight wait in the channel
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(serve)
            if when == "arriving while served":
                await anyio.sleep(0.01)
                theirs.send(_frames(range(9)))
    first = 1 if when == "buffered before serve" else 0
    assert got == [first, first + 1, first + 2] and [type(end) for end in ends] == [anyio.ClosedResourceError]


@pytest.mark.anyio
async def test_a_peer_that_floods_holds_the_loop_for_short_turns() -> None:
    """A served channel takes one recv of at most 16 KiB a turn: another peer's message, sent as a flood of tiny frames
    is being handled, waits for two such turns of it (a few hundred frames each), not two of 64 KiB."""
    flooder, flooding = sockets.socketpair()
    quiet, talking = sockets.socketpair()
    flooding.setblocking(False)
    block = encode({"op": "cancel", "id": 7}) * 1000
    flooded = 0
    with contextlib.suppress(BlockingIOError):
        while (sent := flooding.send(block)) == len(block):  # until the socket is full (its last frame may be cut)
            flooded += sent
    assert flooded > 2 * 65536  # more than two turns of 64 KiB
    heard: list[str] = []

    def flood(message: dict[str, object]) -> None:
        heard.append("flood")
        if len(heard) == 1:
            talking.send(encode({"op": "cancel", "id": 1}))

    channels = Channel(flooder), Channel(quiet)
    with flooding, talking, anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(channels[0].serve, flood)
            tasks.start_soon(channels[1].serve, lambda message: heard.append("quiet"))
            while "quiet" not in heard:
                await anyio.sleep(0)
            tasks.cancel_scope.cancel()
    for channel in channels:
        channel.close()
    per_turn = 16384 // (len(block) // 1000) + 1
    assert 1 <= heard.index("quiet") <= 2 * per_turn


def test_a_channel_served_in_trio_s_guest_run_on_asyncio_reads_as_on_trio() -> None:
    """Trio as asyncio's guest: asyncio.get_running_loop() answers in its tasks too, but serve() must read as trio."""
    trio = pytest.importorskip("trio")
    import asyncio

    async def guest() -> list[object]:
        mine, theirs = sockets.socketpair()
        channel, got = Channel(mine), []
        with theirs:
            theirs.send(_frames(range(9)))
        with trio.fail_after(5), pytest.raises(anyio.EndOfStream):
            await channel.serve(lambda message: got.append(message["id"]))
        channel.close()
        return got

    async def host() -> list[object]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            guest, run_sync_soon_threadsafe=loop.call_soon_threadsafe, done_callback=done.set_result
        )
        result: list[object] = (await done).unwrap()
        return result

    assert asyncio.run(host()) == list(range(9))


# -- managers of one process leasing from a broker in the loop ---------------------------------
@pytest.mark.anyio
async def test_a_request_its_lease_covers_never_talks_to_the_broker(where: Path) -> None:
    async with serving(where, 32 * MiB), MemoryManager(SimulatorBackend(total=DEVICE), broker=where) as mgr:
        member = object()
        mgr.register(member)
        async with mgr.request(member, block(4 * MiB)):
            lease = mgr.statistics().lease
            assert lease is not None and lease.connected and lease.leases == 1
            assert 4 * MiB <= lease.granted <= 32 * MiB and lease.used == 4 * MiB
        for _ in range(20):
            async with mgr.request(member, block(2 * MiB)) as response:
                assert response.chunks == 1
        assert mgr.statistics().lease.leases == 1  # type: ignore[union-attr]
        record = await broker_status(str(where))
        assert record["leased"] == mgr.statistics().lease.granted  # type: ignore[union-attr]
    assert MemoryManager(SimulatorBackend(total=MiB)).statistics().lease is None


@pytest.mark.anyio
async def test_policies_across_managers_wait_chunk_fail(where: Path) -> None:
    async with serving(where, 16 * MiB):
        async with (
            MemoryManager(SimulatorBackend(total=DEVICE), broker=where) as first,
            MemoryManager(SimulatorBackend(total=DEVICE), broker=where, policy="wait") as waiter,
            MemoryManager(SimulatorBackend(total=DEVICE), broker=where, policy="chunk") as chunker,
            MemoryManager(SimulatorBackend(total=DEVICE), broker=where, policy="fail", mode="active") as failer,
        ):
            members = [object() for _ in range(4)]
            for mgr, member in zip((first, waiter, chunker, failer), members):
                mgr.register(member, proportion=0.5 if mgr is failer else None)
            held = await first.request(members[0], block(10 * MiB))
            with pytest.raises(LeaseError, match=rf"{where}.*pid {os.getpid()}"):
                await failer.request(members[3], block(6 * MiB))  # under its cap; the node has 5 MiB free
            async with chunker.request(members[2], block(8 * MiB)) as chunked:
                assert chunked.chunks > 1  # what the node has free now, in chunks
            async with anyio.create_task_group() as tasks:
                got: list[int] = []

                async def wait() -> None:
                    async with waiter.request(members[1], block(12 * MiB)) as response:
                        got.append(response.chunks)

                tasks.start_soon(wait)
                await anyio.sleep(0.1)
                record = await broker_status(str(where))
                assert len(record["waiters"]) == 1 and not got  # waiting at the broker, the loop free
                held.release()
            assert got == [1]  # whole, once the first manager gave its bytes back
            assert (await broker_status(str(where)))["peak"] <= 16 * MiB


@pytest.mark.anyio
@pytest.mark.parametrize("policy", ["wait", "chunk", "fail"])
@pytest.mark.parametrize("split", [1, 4])
async def test_an_unchunkable_batch_over_what_the_broker_could_lease_fails_at_once(
    where: Path, policy: str, split: int
) -> None:
    # it leased all its share could give, then asked again and again for nothing (no waiter: a busy loop)
    async with (
        serving(where, 16 * MiB, split=split),
        MemoryManager(SimulatorBackend(total=DEVICE), broker=where, policy=policy) as mgr,
    ):
        member = object()
        mgr.register(member)
        too_big = {"x": ArrayRequest((5 * MiB,), "float32", unchunkable=True)}  # 20 MiB
        with anyio.fail_after(5), pytest.raises(UnchunkableTooLargeError):
            await mgr.request(member, too_big)
        async with mgr.request(member, block(MiB)) as response:  # the manager serves on
            assert response.chunks == 1


@pytest.mark.anyio
async def test_a_client_of_another_protocol_version_is_refused_and_refuses(where: Path) -> None:
    async with serving(where, MiB):
        stream = await anyio.connect_unix(where)
        async with stream:
            await stream.send(encode({"op": "hello", "v": 99, "role": "client", "pid": 1, "name": "", "hold": 0}))
            answer = decode((await stream.receive())[4:])
        assert answer["op"] == "refused" and f"protocol {VERSION}, the client 99" in answer["reason"]

    async def newer_broker(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(encode({"op": "welcome", "v": 99, "budget": 1, "slab": 1, "device": 0}))

    where.parent.mkdir(mode=0o700, exist_ok=True)
    listener = await anyio.create_unix_listener(where)
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, newer_broker)
        with pytest.raises(BrokerError, match=f"protocol 99, this client {VERSION}"):
            await broker_status(str(where))
        tasks.cancel_scope.cancel()


@pytest.mark.anyio
async def test_the_socket_is_the_owners_only(where: Path) -> None:
    async with serving(where, MiB):
        assert stat.S_IMODE(where.stat().st_mode) == 0o600
        assert stat.S_IMODE(where.parent.stat().st_mode) == 0o700
        with pytest.raises(BrokerError, match="already serves"):
            prepare_socket(where)
    where.parent.chmod(0o755)
    with pytest.raises(BrokerError, match="only you can open.*chmod 700"):
        prepare_socket(where)


def test_a_socket_path_the_broker_cannot_serve_is_refused_saying_what_to_do(where: Path) -> None:
    with pytest.raises(BrokerError, match="only you can open") as refused:
        prepare_socket(Path(tempfile.gettempdir()) / "broker.sock")  # open to all: chmod 700 of it breaks the node
    assert "chmod" not in str(refused.value) and f"aiocubie-{os.getuid()}/broker.sock" in str(refused.value)
    deep = where.parent / ("d" * 120) / "broker.sock"  # bind() raised a bare OSError, the directory left behind
    with pytest.raises(BrokerError, match=f"{len(bytes(deep))} bytes long.*at most"):
        prepare_socket(deep)
    assert not where.parent.exists()


@pytest.mark.anyio
async def test_a_peer_gone_before_its_welcome_leaves_quietly(where: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A peer that says hello and goes at once (a connect cancelled) is let go: no 'unexpected error' logged."""
    caplog.set_level(logging.INFO, "aiocubie.broker")
    async with serving(where, MiB) as served:
        for role in ("status", "client"):
            with sockets.socket(sockets.AF_UNIX) as peer:  # closed before the broker reads the hello
                peer.connect(str(where))
                peer.sendall(encode({"op": "hello", "v": VERSION, "role": role, "pid": 1, "name": "", "hold": 0}))
        with anyio.fail_after(5):
            while "left; its lease is back" not in caplog.text:  # the client's welcome met a closed socket
                await anyio.sleep(0.01)
        assert served.leases.clients == [] and (await broker_status(str(where)))["clients"] == []
    assert "unexpected error" not in caplog.text and "Traceback" not in caplog.text


@pytest.mark.anyio
@pytest.mark.skipif(not hasattr(sockets, "SO_PEERCRED"), reason="peer credentials are Linux's")
async def test_a_peer_of_another_user_is_refused(where: Path) -> None:
    async with serving(where, MiB, allowed_uid=os.getuid() + 1):
        with pytest.raises(BrokerError, match=f"uid {os.getuid()} is not served"):
            await broker_status(str(where))


# -- real processes -----------------------------------------------------------------------------
def test_a_killed_client_s_lease_is_back_within_a_second(where: Path) -> None:
    with broker(where, 64 * MiB):
        holder = spawn(str(Path(__file__).with_name("brokerkit.py")), "hold", str(where), str(8 * MiB))
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        record = status(where)
        assert [c["pid"] for c in record["clients"]] == [holder.pid] and record["leased"] >= 8 * MiB  # type: ignore[index]
        shown = spawn("-m", "aiocubie", "broker", "status", "--socket", str(where)).communicate(timeout=30)[0]
        assert "clients (1):" in shown and f"pid {holder.pid}" in shown and "waiters (0):" in shown
        holder.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        holder.wait()
        while status(where)["leased"]:
            assert time.monotonic() - killed < 1.0
            time.sleep(0.01)


def test_a_dead_broker_leaves_arrays_valid_and_is_rejoined(where: Path) -> None:
    async def main() -> None:
        async with MemoryManager(SimulatorBackend(total=DEVICE), broker=where) as mgr:
            member = object()
            mgr.register(member)
            with broker(where, 32 * MiB) as first:
                held = await mgr.request(member, block(4 * MiB))
                held.arrays["x"].fill(7.0)
                first.kill()
                first.wait()
            await anyio.sleep(0.05)
            assert (held.arrays["x"].get() == 7.0).all()  # the arrays stay valid
            with pytest.raises(BrokerError, match="no broker answers at"):
                await mgr.request(member, block(30 * MiB))  # not covered: a lease, and no broker
            with broker(where, 32 * MiB):
                async with mgr.request(member, block(8 * MiB)) as response:
                    assert response.chunks == 1
                    record = await broker_status(str(where))
                    assert record["leased"] >= 12 * MiB  # what it held through the death, told again
            held.release()

    anyio.run(main)


def test_hostile_bytes_close_only_their_connection(where: Path) -> None:
    with broker(where, 8 * MiB) as process:
        hello = encode({"op": "hello", "v": VERSION, "role": "client", "pid": 1, "name": "", "hold": 0})
        frames = st.one_of(
            st.binary(max_size=64),
            st.builds(lambda body: struct.pack(">I", len(body)) + body, st.binary(max_size=64)),
            st.builds(lambda n: struct.pack(">I", n), st.integers(MAX_FRAME + 1, 2**32 - 1)),
            st.builds(
                lambda m: encode(m),
                st.dictionaries(
                    st.sampled_from(["op", "id", "v", "min"]),
                    st.integers() | st.text(max_size=5) | st.none(),
                    max_size=4,
                ),
            ),
            st.builds(
                lambda m: hello + encode(m),
                st.dictionaries(
                    st.sampled_from(["op", "id", "bytes", "want"]),
                    st.integers(-2, 2**64) | st.sampled_from(["lease", "return", "cancel", "steal"]),
                    max_size=4,
                ),
            ),
        )

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(frames, st.booleans())
        def attack(data: bytes, welcomed: bool) -> None:
            refused = False  # a message the broker must close the connection for, the peer's end not waited for
            with sockets.socket(sockets.AF_UNIX) as peer:
                peer.settimeout(2)
                peer.connect(str(where))
                if welcomed and data.startswith(hello):  # the rest reaches a served connection (the loop's callback)
                    peer.sendall(hello)
                    assert decode(peer.recv(4096)[4:])["op"] == "welcome"
                    data = data[len(hello) :]
                    try:
                        refused = decode(data[4:])["op"] not in ("lease", "cancel", "return", "status")
                    except ProtocolError:
                        refused = True
                peer.sendall(data)
                if not refused:
                    peer.shutdown(sockets.SHUT_WR)
                try:
                    while peer.recv(4096):
                        pass  # the broker answers, then closes (or closes at once)
                except TimeoutError:
                    assert not refused, f"{data!r} left its connection open"
                except OSError:
                    pass

        attack()
        assert process.poll() is None  # alive
        record = status(where)
        assert record["leased"] == 0 and record["clients"] == []
        assert process.stderr is not None
    log = process.stderr.read()
    assert "broke the protocol" in log and "Traceback" not in log


def test_eight_clients_storm_one_node_budget(where: Path) -> None:
    budget, clients = 48 * MiB, 8
    kit = str(Path(__file__).with_name("brokerkit.py"))
    with broker(where, budget):
        storms = [spawn(kit, "storm", str(where), str(seed), "40") for seed in range(clients)]
        victim = storms[3]
        deadline = time.monotonic() + 30
        while not any(c["pid"] == victim.pid and c["lease"] for c in status(where)["clients"]):  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the victim never leased"
            time.sleep(0.01)
        victim.send_signal(signal.SIGKILL)  # in the middle of its storm, holding a lease
        results = []
        for process in storms:
            out, err = process.communicate(timeout=50)
            if process is victim:
                continue
            assert process.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        record = status(where)
    assert record["peak"] <= budget and record["leased"] == 0 and record["clients"] == []
    for result in results:
        assert result["wrong"] == 0 and result["errors"] == {}, result
    served = sum(r["correct"] for r in results)
    assert served >= 0.5 * 40 * (clients - 1), results
    assert {r["policy"] for r in results} == {"chunk", "wait"}


@pytest.mark.parametrize(
    ("options", "why"), [({"split": 0}, "cannot be split 0 ways"), ({"slab": 2 * MiB}, "a smaller --slab")]
)
def test_a_broker_of_a_split_or_slab_its_budget_cannot_hold_is_refused(
    where: Path, options: dict[str, int], why: str
) -> None:
    with pytest.raises(BrokerError, match=why):
        Broker(where, MiB, **options)  # type: ignore[arg-type]


def test_the_command_needs_a_budget_and_a_broker(where: Path) -> None:
    _, err = spawn("-m", "aiocubie", "broker", "--socket", str(where)).communicate(timeout=30)
    assert "needs --budget BYTES" in err
    _, err = spawn("-m", "aiocubie", "broker", "status", "--socket", str(where)).communicate(timeout=30)
    assert f"no broker answers at {where}" in err
    assert "arrays" not in err and "AIOCUBIE_BROKER" not in err  # a status reader holds none, and set no variable


@pytest.mark.anyio
async def test_grows_beside_a_waiting_grow_are_answered_and_end_when_the_broker_goes(where: Path) -> None:
    from aiocubie._broker.client import BrokerLease

    async with anyio.create_task_group() as tasks:

        def spawn(run: object, *args: object, name: str) -> bool:
            tasks.start_soon(run, *args, name=name)  # type: ignore[arg-type]
            return True

        async with serving(where, 8 * MiB, slab=MiB):
            holder, asker = BrokerLease(str(where), spawn), BrokerLease(str(where), spawn)
            holder.bind(lambda: holder.granted, lambda: None)  # holds all it is granted: no give-back
            assert await holder.grow(6 * MiB, 6 * MiB, wait=False) == 6 * MiB
            got: list[int] = []

            async def waits() -> None:
                got.append(await asker.grow(4 * MiB, 4 * MiB, wait=True))

            tasks.start_soon(waits)  # queued at the broker
            await anyio.sleep(0.05)
            assert not got
            with anyio.fail_after(5), pytest.raises(LeaseError, match="1 waiting"):
                await asker.grow(0, 0, wait=False)  # answered while the first grow waits
            assert not got
            holder.bind(lambda: 0, lambda: None)  # now idle: the broker's pressure (read by its parked reader)
            holder.released()  # gives it back; the queued grow is granted
            with anyio.fail_after(5):
                while not got:
                    await anyio.sleep(0.01)
            assert got == [4 * MiB] and holder.granted == 0
            ends: list[BaseException] = []
            holder.bind(lambda: holder.granted, lambda: None)
            asker.bind(lambda: asker.granted, lambda: None)  # each holds its grant now: the next ask waits
            assert await holder.grow(3 * MiB, 3 * MiB, wait=False) == 3 * MiB  # 1 MiB free

            async def queued() -> None:
                try:
                    await asker.grow(2 * MiB, 2 * MiB, wait=True)  # over what is free: waits
                except BrokerError as exc:
                    ends.append(exc)

            tasks.start_soon(queued)
            await anyio.sleep(0.05)
            assert not ends
        with anyio.fail_after(5):  # the broker stopped: the reader ends the wait
            while not ends:
                await anyio.sleep(0.01)
        assert "went away" in str(ends[0]) and asker.granted == 4 * MiB  # what it holds
        assert "the next lease connects again once a broker serves that socket (restart it)" in str(ends[0])
        tasks.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_connection_lost_before_its_reader_starts_is_not_served(where: Path) -> None:
    """A broker that welcomes, then reads nothing: the first ask breaks the pipe (no end of stream comes), and the
    reader, started after the loss, ends at once instead of serving the lost connection until the manager ends."""
    from aiocubie._broker.client import BrokerLease

    async def deaf(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            # deaf before the welcome: an ask sent after it always breaks the pipe (after, the ask could race it)
            stream.extra(anyio.abc.SocketAttribute.raw_socket).shutdown(sockets.SHUT_RD)
            await stream.send(encode({"op": "welcome", "v": VERSION, "budget": 8 * MiB, "slab": MiB, "device": 0}))
            await anyio.sleep_forever()

    where.parent.mkdir(mode=0o700, exist_ok=True)
    listener = await anyio.create_unix_listener(where)
    started: list[str] = []
    alive: list[str] = []
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, deaf)

        def spawn(run: Any, *args: object, name: str) -> bool:
            async def counted() -> None:
                started.append(name)
                alive.append(name)
                try:
                    await run(*args)
                finally:
                    alive.remove(name)

            tasks.start_soon(counted)
            return True

        with anyio.fail_after(5), pytest.raises(BrokerError, match="went away"):
            await BrokerLease(str(where), spawn).grow(MiB, MiB, wait=False)
        with anyio.fail_after(5):
            while not started or alive:
                await anyio.sleep(0.01)
        tasks.cancel_scope.cancel()
