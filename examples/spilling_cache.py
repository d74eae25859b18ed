"""A cache that spills to host while a stage that matters more runs.

A lookup component keeps a table on the device between its steps: a cache, marked spillable. A
solver stage needs most of the device for each of its batches. When a solver batch would not fit
whole, the manager copies the idle table to pinned host memory and frees its device memory; the
lookup's next ``async with response.use()`` brings it back (possibly at a new address) before it reads.
The solver is registered with a higher priority than the lookup: spilling makes room only for a request
of equal or higher priority than the arrays it moves, so the lookup's table goes for the solver, never
the other way round. Without a GPU it runs on aiocubie's simulator.
Run: python examples/spilling_cache.py
"""

from __future__ import annotations

import contextlib

import aiocubie

BACKEND, WHY = aiocubie.select_backend()

import anyio  # noqa: E402
import numpy as np  # noqa: E402

from aiocubie import ArrayRequest, MemoryManager, current_cupy_stream  # noqa: E402
from aiocubie.simulator import SimulatorBackend  # noqa: E402

TABLE = 4 << 20  # bytes of the lookup table (float32)
BATCH = 13 << 20  # bytes of one solver batch: with the table resident it would not fit whole
STEPS = 3


class Lookup:
    """Keeps a table on the device between its steps."""


class Solver:
    """A stage that needs most of the device for each batch."""


async def main() -> None:
    simulated = SimulatorBackend(16 << 20) if BACKEND == "simulator" else None
    limit = None if simulated else 16 << 20  # on a GPU, the same 16 MiB through a memory limit
    with simulated or contextlib.nullcontext("cuda") as backend:
        async with MemoryManager(backend, policy="chunk", headroom=0.0, memory_limit=limit) as mgr:
            lookup, solver = Lookup(), Solver()
            mgr.register(lookup, stream_group="lookup", priority=0)
            mgr.register(solver, stream_group="solve", priority=1)  # the stage that matters more
            values = np.arange(TABLE // 4, dtype=np.float32)
            table = await mgr.request(lookup, {"t": ArrayRequest(values.shape, np.float32, spillable=True)})
            async with table.use() as arrays:
                arrays["t"].set(values)
            for step in range(STEPS):
                async with await mgr.request(solver, {"x": ArrayRequest((BATCH // 4,), np.float32)}) as batch:
                    print(f"solver batch {step}: {batch.chunks} chunk(s)")  # whole: the idle table went to host
                async with table.use() as arrays:  # back on the device before the lookup reads it
                    with current_cupy_stream(table.stream):
                        total = float(arrays["t"].sum())
                    print(f"lookup step {step}: table sum {total:.0f}, intact: {total == float(values.sum())}")
            spill = mgr.stats().spill
            print(f"table spilled {spill.spills} times, restored {spill.restores} times")
            print(next(line for line in mgr.summary().splitlines() if line.startswith("spilled:")))
            table.release()
            print(f"pinned host bytes after release: {mgr.backend.device.pinned_pool.in_use}")


if __name__ == "__main__":
    anyio.run(main)
