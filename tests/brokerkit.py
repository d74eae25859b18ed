"""Real processes for the broker's tests: a broker (``python -m aiocubie broker``) and storm clients.

``python tests/brokerkit.py storm SOCKET SEED REQUESTS [cuda]`` runs one client's seeded request storm
(mixed sizes, policies and cancellations; on the simulator, or the GPU) against the broker and prints
what happened as one JSON line;
``python tests/brokerkit.py hold SOCKET BYTES`` leases and holds an array until killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
#: Each client's simulated device: larger than the node budget, so only the broker bounds them.
DEVICE = 256 * MiB


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def spawn(*args: str) -> subprocess.Popen[str]:
    """A Python process running ``args`` with this checkout first on the path."""
    return subprocess.Popen(
        [sys.executable, *args], env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@contextlib.contextmanager
def broker(path: Path, budget: int, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """A broker process serving ``path`` until the block ends (SIGTERM)."""
    process = spawn("-m", "aiocubie", "broker", "--socket", str(path), "--budget", str(budget), *extra)
    try:
        wait_for_socket(path, process)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_socket(path: Path, process: subprocess.Popen[str], timeout: float = 20) -> None:
    """Until the broker answers at ``path`` (a socket file left by a killed broker does not count)."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
                return
            except OSError:
                pass
        if process.poll() is not None:
            raise RuntimeError(
                f"the broker exited ({process.returncode}): {process.stderr.read() if process.stderr else ''}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"no broker answers at {path} after {timeout} s")
        time.sleep(0.02)


def status(path: Path) -> dict[str, object]:
    from aiocubie._broker.client import broker_status

    result: dict[str, object] = anyio.run(broker_status, str(path))
    return result


async def storm(socket: str, seed: int, count: int, backend: str = "simulator") -> dict[str, object]:
    """One client's storm; returns its counts (correct outputs, cancellations, errors by type)."""
    from aiocubie import ArrayRequest, MemoryManager
    from aiocubie.simulator import SimulatorBackend

    rng = random.Random(seed)
    policy = ("chunk", "wait")[seed % 2]
    errors: Counter[str] = Counter()
    done = {"correct": 0, "wrong": 0, "cancelled": 0, "chunked": 0}
    device = SimulatorBackend(total=DEVICE) if backend == "simulator" else backend
    async with MemoryManager(device, broker=socket, policy=policy) as mgr:
        members = [object() for _ in range(3)]
        for index, member in enumerate(members):
            mgr.register(member, stream_group=f"g{index}")

        async def one(index: int) -> None:
            member = rng.choice(members)
            rows = rng.choice((1, 4, 16, 64))  # x 64 Ki float32 runs: 256 KiB to 16 MiB
            request = {"x": ArrayRequest((rows, 65536), "float32", chunk_axis=1)}
            value = float(seed * 10_000 + index)
            with anyio.move_on_after(rng.uniform(0, 0.01) if rng.random() < 0.15 else 60) as scope:
                try:
                    async with mgr.request(member, request) as response:
                        done["chunked"] += response.chunks > 1
                        x = response.arrays["x"]
                        x.fill(value)
                        await anyio.sleep(rng.uniform(0, 0.004))
                        done["correct" if (x.get() == value).all() else "wrong"] += 1
                except Exception as exc:
                    errors[type(exc).__name__] += 1
            done["cancelled"] += scope.cancelled_caught

        async with anyio.create_task_group() as tasks:
            for index in range(count):
                tasks.start_soon(one, index)
                await anyio.sleep(rng.uniform(0, 0.002))
    return {**done, "errors": dict(errors), "policy": policy}


async def hold(socket: str, nbytes: int) -> None:
    """Lease ``nbytes`` and hold them until killed (prints ``held`` once it does)."""
    from aiocubie import ArrayRequest, MemoryManager
    from aiocubie.simulator import SimulatorBackend

    async with MemoryManager(SimulatorBackend(total=DEVICE), broker=socket) as mgr:
        member = object()
        mgr.register(member)
        async with mgr.request(member, {"x": ArrayRequest((nbytes,), "uint8", unchunkable=True)}):
            print("held", flush=True)
            await anyio.sleep(3600)


if __name__ == "__main__":
    verb, path, number = sys.argv[1:4]
    if verb == "storm":
        print(json.dumps(anyio.run(storm, path, int(number), int(sys.argv[4]), *sys.argv[5:6])), flush=True)
    else:
        anyio.run(hold, path, int(number))
