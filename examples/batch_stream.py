"""A batch stream: an async loader refilling a ring of pinned buffers, k batches in flight.

The loader "reads" each batch (a pause stands in for a file or a socket) into one of k pinned
host buffers, and refills a buffer only once the batch that used it has landed: walk_batches asks
for batch b once batch b - k is done. Each batch is copied in, worked on and copied out on the
group's stream, k batches queued at most, through one response's arrays. On a GPU the work is
CuPy's, queued on chunk.stream; without one it runs on aiocubie's simulator.
Run: python examples/batch_stream.py
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiocubie

BACKEND, WHY = aiocubie.select_backend()

import anyio  # noqa: E402
import numpy as np  # noqa: E402

from aiocubie import ArrayRequest, MemoryManager, current_cupy_stream, walk_batches  # noqa: E402
from aiocubie.simulator import SimulatorBackend  # noqa: E402

K, BATCHES, SHAPE = 3, 24, (512, 256)  # batches in flight, batches, one batch's shape (512 KiB)


class Loader:
    """A component that streams batches through the device."""


async def read(
    xs: list[np.ndarray], ys: list[np.ndarray], landed: list[np.ndarray]
) -> AsyncIterator[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Batch b's inputs in ring buffer b % K; before refilling it, keep what batch b - K left in its output."""
    for b in range(BATCHES):
        slot = b % K
        if b >= K:
            landed.append(ys[slot].copy())  # batch b - K has landed: its outputs are in, its buffers free
        await anyio.sleep(0.001)  # reading batch b
        xs[slot][...] = b
        yield {"x": xs[slot]}, {"y": ys[slot]}


async def main() -> None:
    simulated = SimulatorBackend(64 << 20) if BACKEND == "simulator" else None
    with simulated or contextlib.nullcontext("cuda") as backend:  # a backend passed in is closed by who made it
        async with MemoryManager(backend) as mgr:
            loader = Loader()
            mgr.register(loader)
            xs = [mgr.host.array(SHAPE, np.float32) for _ in range(K)]  # pinned: copies go straight
            ys = [mgr.host.array(SHAPE, np.float32) for _ in range(K)]
            requests = {"x": ArrayRequest(SHAPE, np.float32), "y": ArrayRequest(SHAPE, np.float32)}
            landed: list[np.ndarray] = []
            async with mgr.request(loader, requests, ordered=True) as response:  # once, for every batch
                async for chunk in walk_batches(response, read(xs, ys, landed), in_flight=K):
                    with current_cupy_stream(chunk.stream):  # queued on the group's stream, not waited for
                        chunk.device["y"][...] = chunk.device["x"] * 2 + 1
            landed += [ys[b % K] for b in range(BATCHES - K, BATCHES)]  # the last K, landed when the loop ended
            right = all(np.array_equal(y, np.full(SHAPE, 2 * b + 1, np.float32)) for b, y in enumerate(landed))
        print(f"{BATCHES} batches, {K} in flight, every output right: {right} on {BACKEND} ({WHY})")


if __name__ == "__main__":
    anyio.run(main)
