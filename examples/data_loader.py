"""An async data loader feeding a numba CUDA kernel through aiocubie.

The loader reads batches (here: makes them, with a pause standing in for I/O) while the
consumer runs the kernel on the previous batch; a buffer of two batches gives backpressure.
Without a GPU it runs on aiocubie's simulator and numba's CUDA simulator.
Run: python examples/data_loader.py
"""

from __future__ import annotations

import contextlib

import aiocubie

BACKEND, WHY = aiocubie.select_backend()  # before numba.cuda is imported: it may set NUMBA_ENABLE_CUDASIM

import anyio  # noqa: E402
import anyio.abc  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from aiocubie import ArrayRequest, MemoryManager, walk_chunks  # noqa: E402
from aiocubie.simulator import SimulatorBackend  # noqa: E402

BATCHES, RUNS, WIDTH = 4, 2_000, 3


@cuda.jit
def normalise(rows, out):  # pragma: no cover - compiled by numba
    # Grid-stride loop: any launch size covers every row.
    for i in range(cuda.grid(1), rows.shape[0], cuda.gridsize(1)):
        total = 0.0
        for j in range(rows.shape[1]):
            total += rows[i, j]
        for j in range(rows.shape[1]):
            out[i, j] = rows[i, j] / total


def launch(kernel, size: int, stream, *args) -> None:
    if BACKEND == "simulator":
        kernel[1, 32](*args)  # each simulated GPU thread is a Python thread: keep it small
    else:
        kernel[(size + 255) // 256, 256, stream](*args)


async def load(send: anyio.abc.ObjectSendStream) -> None:
    async with send:
        for batch in range(BATCHES):
            await anyio.sleep(0.01)  # reading a file, a socket...
            await send.send(np.random.default_rng(batch).uniform(1.0, 2.0, (RUNS, WIDTH)))


class Consumer:
    async def consume(self, mgr: MemoryManager, receive: anyio.abc.ObjectReceiveStream) -> int:
        done = 0
        async with receive:
            async for rows in receive:
                out = mgr.host.array(rows.shape, rows.dtype)
                requests = {"rows": ArrayRequest(rows.shape, rows.dtype), "out": ArrayRequest(rows.shape, rows.dtype)}
                async with mgr.request(self, requests) as response:
                    async for chunk in walk_chunks(response, inputs={"rows": rows}, outputs={"out": out}):
                        launch(normalise, chunk.length, response.stream, chunk.device["rows"], chunk.device["out"])
                        await mgr.groups.sync(self)
                assert np.allclose(out, rows / rows.sum(axis=1, keepdims=True))
                print(f"batch {done}: {RUNS} rows normalised in {response.chunks} chunks")
                done += 1
        return done


async def main() -> None:
    simulated = SimulatorBackend(64 << 10) if BACKEND == "simulator" else None
    with simulated or contextlib.nullcontext("cuda") as backend:  # a backend passed in is closed by who made it
        async with MemoryManager(backend) as mgr:
            consumer = Consumer()
            mgr.register(consumer, stream_group="compute")
            send, receive = anyio.create_memory_object_stream[np.ndarray](2)
            async with anyio.create_task_group() as tg:
                tg.start_soon(load, send)
                done = await consumer.consume(mgr, receive)
        print(f"{done} batches checked against numpy on {BACKEND} ({WHY})")


if __name__ == "__main__":
    anyio.run(main)
