"""Two managers, one node budget: a broker process, and managers that lease from it.

Run: python examples/broker_share.py  (the simulator; no GPU needed)

It starts ``python -m aiocubie broker`` with a 16 MiB budget, then two managers (they could as well
be two processes) ask for 12 MiB each: the second waits at the broker until the first releases.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.simulator import SimulatorBackend

MiB = 1 << 20


async def main(socket: str) -> None:
    request = {"x": ArrayRequest((12 * MiB // 4,), np.float32, chunk_axis=0)}
    async with (
        MemoryManager(SimulatorBackend(total=64 * MiB), broker=socket) as first,
        MemoryManager(SimulatorBackend(total=64 * MiB), broker=socket, policy="wait") as second,
    ):
        a, b = object(), object()
        first.register(a)
        second.register(b)
        held = await first.request(a, request)
        print(f"first: {held.chunks} chunk, lease {first.statistics().lease.granted // MiB} MiB")

        async def wait_then_use() -> None:
            async with second.request(b, request) as response:
                print(f"second: served whole ({response.chunks} chunk) once the first released")

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait_then_use)
            await anyio.sleep(0.2)  # the second waits at the broker meanwhile; this loop runs on
            print("first: releasing")
            held.release()


if __name__ == "__main__":
    folder = Path(tempfile.mkdtemp(prefix="aiocubie-"))  # mode 0700: the broker's socket is yours alone
    socket = str(folder / "broker.sock")
    broker = subprocess.Popen(
        [sys.executable, "-m", "aiocubie", "broker", "--socket", socket, "--budget", "16MiB"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), *sys.path])},
        stderr=subprocess.DEVNULL,
    )
    try:
        while not Path(socket).exists():
            time.sleep(0.02)
        anyio.run(main, socket)
    finally:
        broker.terminate()
        broker.wait()
        shutil.rmtree(folder, ignore_errors=True)  # the broker removed its socket; the folder is ours
