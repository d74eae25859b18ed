"""The node broker's costs (issue 34): a request its lease covers, and a lease round trip.

Usage: python benchmarks/bench_broker.py [--backend simulator|cuda] [--quick]

1. ``async with mgr.request(...)`` of one 1 MiB array whose lease already covers it, against the
   same request by a manager without a broker, in the same run (alternating rounds; target <= 1.05x).
2. A lease round trip to a broker in another process (``python -m aiocubie broker``): p50 and p99
   (target p50 <= 100 us), beside two floors in another process: a bare anyio stream echo, and a raw
   non-blocking socket echo kept on asyncio's loop on both sides (what the broker's channel stands on).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def backend(name: str) -> Any:
    if name == "cuda":
        return "cuda"
    from aiocubie.simulator import SimulatorBackend

    return SimulatorBackend(total=1 << 30)


async def requests_per_second(mgr: Any, count: int) -> float:
    """Seconds per request + release of one 1 MiB array, over ``count`` requests."""
    from aiocubie import ArrayRequest

    member = object()
    mgr.register(member)
    request = {"x": ArrayRequest((MIB // 4,), np.float32, chunk_axis=0)}
    async with mgr.request(member, request):  # warm: the lease (with a broker) and the pool
        pass
    started = time.perf_counter()
    for _ in range(count):
        async with mgr.request(member, request):
            pass
    elapsed = (time.perf_counter() - started) / count
    mgr.unregister(member)
    return elapsed


async def covered(name: str, path: str, count: int, rounds: int) -> tuple[float, float, int]:
    """Best seconds per request with and without a broker, and the lease round trips the broker run made."""
    from aiocubie import MemoryManager

    bare: list[float] = []
    leased: list[float] = []
    async with MemoryManager(backend(name)) as plain, MemoryManager(backend(name), broker=path) as client:
        for _ in range(rounds):  # alternate, so that drift hits both alike
            bare.append(await requests_per_second(plain, count))
            leased.append(await requests_per_second(client, count))
        trips = client.statistics().lease.leases
    return min(bare), min(leased), trips


async def round_trips(path: str, count: int) -> list[float]:
    """Seconds of each of ``count`` lease round trips (ask for 0 more bytes: the broker answers at once)."""
    from aiocubie._broker.client import BrokerLease

    samples: list[float] = []
    async with anyio.create_task_group() as tasks:

        def spawn(run: Any, *args: Any, name: str) -> bool:
            tasks.start_soon(run, *args, name=name)
            return True

        lease = BrokerLease(path, spawn, name="bench")
        await lease.grow(0, 0, wait=False)  # connect
        for _ in range(count):
            started = time.perf_counter()
            await lease.grow(0, 0, wait=False)
            samples.append(time.perf_counter() - started)
        tasks.cancel_scope.cancel()
    return samples


ANYIO_ECHO = (
    "import anyio, sys\n"
    "async def main():\n"
    "    async def echo(stream):\n"
    "        async with stream:\n"
    "            async for data in stream:\n"
    "                await stream.send(data)\n"
    "    await (await anyio.create_unix_listener(sys.argv[1])).serve(echo)\n"
    "anyio.run(main)\n"
)

LOOP_ECHO = (
    "import asyncio, socket, sys\n"
    "async def main():\n"
    "    loop = asyncio.get_running_loop()\n"
    "    listener = socket.socket(socket.AF_UNIX)\n"
    "    listener.bind(sys.argv[1]); listener.listen(); listener.setblocking(False)\n"
    "    def serve(peer):\n"
    "        peer.setblocking(False)\n"
    "        def echo():\n"
    "            data = peer.recv(65536)\n"
    "            peer.send(data) if data else (loop.remove_reader(peer), peer.close())\n"
    "        loop.add_reader(peer, echo)\n"
    "    loop.add_reader(listener, lambda: serve(listener.accept()[0]))\n"
    "    await asyncio.Event().wait()\n"
    "asyncio.run(main())\n"
)


def _against_server(code: str, path: str, client: Callable[[], Awaitable[list[float]]]) -> list[float]:
    """``client()``'s samples, run against the echo server ``code`` serving ``path`` in another process."""
    server = subprocess.Popen([sys.executable, "-c", code, path])
    try:
        while not Path(path).exists():
            time.sleep(0.02)
        return anyio.run(client)
    finally:
        server.terminate()
        server.wait()


def echo_in_process(path: str, count: int) -> list[float]:
    """Seconds of each of ``count`` round trips of 8 bytes to a bare anyio Unix-socket echo in another process.

    The floor a lease round trip stands on: the same sockets and event loops, no protocol.
    """

    async def client() -> list[float]:
        samples: list[float] = []
        async with await anyio.connect_unix(path) as stream:
            for _ in range(count + 1):
                started = time.perf_counter()
                await stream.send(b"12345678")
                await stream.receive()
                samples.append(time.perf_counter() - started)
        return samples[1:]

    return _against_server(ANYIO_ECHO, path, client)


def loop_echo_in_process(path: str, count: int) -> list[float]:
    """Seconds of each of ``count`` round trips of 8 bytes over raw sockets kept on asyncio's loop, both sides.

    What the broker's channel stands on (``loop.add_reader`` once; each message handled in its callback).
    """

    async def client() -> list[float]:
        loop = asyncio.get_running_loop()
        samples: list[float] = []
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.setblocking(False)
            answered = loop.create_future()

            def readable() -> None:
                if sock.recv(65536) and not answered.done():
                    answered.set_result(None)

            loop.add_reader(sock, readable)
            try:
                for _ in range(count + 1):
                    answered = loop.create_future()
                    started = time.perf_counter()
                    sock.send(b"12345678")
                    await answered
                    samples.append(time.perf_counter() - started)
            finally:
                loop.remove_reader(sock)
        return samples[1:]

    return _against_server(LOOP_ECHO, path, client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("simulator", "cuda"), default="simulator")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    count, rounds, trips = (500, 3, 2000) if args.quick else (5000, 7, 20000)
    folder = Path(tempfile.mkdtemp(prefix="aiocubie-bench-"))
    path = str(folder / "broker.sock")
    budget = str(8 << 30 if args.backend == "cuda" else 512 * MIB)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    broker = subprocess.Popen(
        [sys.executable, "-m", "aiocubie", "broker", "--socket", path, "--budget", budget],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not Path(path).exists():
            time.sleep(0.02)
        bare, leased, made = anyio.run(covered, args.backend, path, count, rounds)
        samples = sorted(anyio.run(round_trips, path, trips))
    finally:
        broker.terminate()
        broker.wait()
    echo = sorted(echo_in_process(str(folder / "echo.sock"), trips))
    raw = sorted(loop_echo_in_process(str(folder / "raw.sock"), trips))
    p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
    ratio = leased / bare
    print(f"backend {args.backend}; best of {rounds} rounds of {count} requests (1 MiB, request + release)")
    print(f"  without a broker      {bare * 1e6:8.2f} us/request")
    print(
        f"  lease covers it       {leased * 1e6:8.2f} us/request  {ratio:.3f}x  (target <= 1.05x: {'met' if ratio <= 1.05 else 'NOT met'}; {made} lease round trip(s) in all)"
    )
    print(
        f"lease round trip ({trips}): p50 {p50 * 1e6:.1f} us, p99 {p99 * 1e6:.1f} us, mean {statistics.fmean(samples) * 1e6:.1f} us  (target p50 <= 100 us: {'met' if p50 <= 100e-6 else 'NOT met'})"
    )

    print(
        f"echo round trip ({trips}, bare anyio Unix socket, another process: the floor): p50 {echo[len(echo) // 2] * 1e6:.1f} us, p99 {echo[int(len(echo) * 0.99)] * 1e6:.1f} us"
    )
    print(
        f"raw socket echo ({trips}, kept on the loop both sides, as the channel): p50 {raw[len(raw) // 2] * 1e6:.1f} us, p99 {raw[int(len(raw) * 0.99)] * 1e6:.1f} us; lease p50 / raw p50 {p50 / raw[len(raw) // 2]:.2f}x"
    )


if __name__ == "__main__":
    main()
