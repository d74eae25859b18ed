"""An async pipeline: two solvers share a stream group and one batch, a post-processor has its own.

The solvers ask at the same time, so their requests are planned together: one chunk plan for
the batch, walked in lockstep. Without a GPU the budget is a 256 KiB simulated device, smaller
than the work. The device arrays are CuPy arrays (on the simulator, its model of them): the
solvers compute with CuPy's arithmetic, bound to their group's stream.
Run: python examples/async_pipeline.py
"""

from __future__ import annotations

import contextlib

import anyio
import numpy as np

import aiocubie
from aiocubie import ArrayRequest, MemoryManager, walk_chunks
from aiocubie.simulator import SimulatorBackend

RUNS = 20_000


class Solver:
    """Computes y = a * x + 1 for its own x (on the device arrays, as a kernel would)."""

    def __init__(self, a: float) -> None:
        self.a = a

    async def solve(self, mgr: MemoryManager, x: np.ndarray) -> tuple[np.ndarray, int]:
        y = np.empty_like(x)
        requests = {
            "x": ArrayRequest(x.shape, x.dtype, chunk_axis=1),
            "y": ArrayRequest(x.shape, x.dtype, chunk_axis=1),
        }
        async with mgr.request(self, requests) as response:
            async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}):
                with aiocubie.current_cupy_stream(response.stream):  # CuPy work on the group's stream
                    chunk.device["y"][...] = self.a * chunk.device["x"] + 1
            return y, response.chunks


class PostProcessor:
    """Sums each run's column, in its own stream group."""

    async def reduce(self, mgr: MemoryManager, y: np.ndarray) -> np.ndarray:
        sums = np.empty(y.shape[1])
        async with mgr.request(
            self, {"y": ArrayRequest(y.shape, y.dtype, chunk_axis=1), "s": ArrayRequest(y.shape[1], y.dtype)}
        ) as response:
            async for chunk in walk_chunks(response, inputs={"y": y}, outputs={"s": sums}):
                with aiocubie.current_cupy_stream(response.stream):
                    chunk.device["s"][...] = chunk.device["y"].sum(axis=0)
        return sums


async def main() -> None:
    x = np.random.default_rng(0).standard_normal((4, RUNS))
    results: dict[str, tuple[np.ndarray, int]] = {}
    simulated = SimulatorBackend(256 << 10) if not aiocubie.gpu_status()[0] else None
    with simulated or contextlib.nullcontext("cuda") as backend:  # a backend passed in is closed by who made it
        async with MemoryManager(backend) as mgr:
            solvers = {"solver-a": Solver(2.0), "solver-b": Solver(-1.0)}
            for name, solver in solvers.items():
                mgr.register(solver, stream_group="solve", name=name)
            post = PostProcessor()
            mgr.register(post, stream_group="post", name="post")

            async def run(name: str) -> None:
                results[name] = await solvers[name].solve(mgr, x)

            async with anyio.create_task_group() as tg:
                for name in solvers:
                    tg.start_soon(run, name)
            sums = await post.reduce(mgr, results["solver-a"][0])
            stats = mgr.stats()
        for name, solver in solvers.items():
            y, chunks = results[name]
            assert np.allclose(y, solver.a * x + 1)
            print(f"{name}: {chunks} chunks, all {y.size} elements correct")
        assert np.allclose(sums, (2.0 * x + 1).sum(axis=0))
        print(f"solve group: {stats.groups['solve'].batches} batch(es) for {stats.groups['solve'].requests} requests")
        print(f"post: sums of {sums.size} runs correct; peak {stats.peak_bytes} of {stats.total} bytes")


if __name__ == "__main__":
    print("aiocubie", aiocubie.__version__)
    anyio.run(main)
