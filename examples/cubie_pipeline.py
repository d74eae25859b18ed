"""A cubie solver and an aiocubie loader sharing one device, in one async program.

Two cubie solves run in worker threads (``await aiocubie.cubie.solve(...)``) while an async
loader keeps asking for batches on the same loop. The solves are planned by aiocubie against what
the loader holds, and everything shows in one stats table. Without a GPU it runs on aiocubie's
simulator and cubie's CUDA simulator. Needs the cubie extra: pip install "aiocubie[cubie]".
Run: python examples/cubie_pipeline.py
"""

from __future__ import annotations

import contextlib

import aiocubie

BACKEND, WHY = aiocubie.select_backend()  # without a GPU it sets NUMBA_ENABLE_CUDASIM=1, which cubie reads

try:
    from cubie import Solver, create_ODE_system
except ImportError:
    raise SystemExit('this example needs cubie: pip install "aiocubie[cubie]"') from None

import anyio  # noqa: E402
import numpy as np  # noqa: E402

from aiocubie import ArrayRequest, MemoryManager  # noqa: E402
from aiocubie.cubie import CUBIE_HEADROOM, CubieMemoryManager, solve  # noqa: E402
from aiocubie.simulator import SimulatorBackend  # noqa: E402

RUNS = 120
SETTINGS = {"duration": 0.1, "dt": 0.01, "save_every": 0.01}
SIMULATED_DEVICE = 64 * 1024  # bytes: small, so that the solves chunk around what the loader holds


class Loader:
    """Loads batches of rows onto the device, one request each, until told to stop."""

    batches = 0

    async def run(self, mgr: MemoryManager, stop: anyio.Event) -> None:
        while not stop.is_set():
            async with mgr.request(self, {"rows": ArrayRequest((256, 4), np.float32)}) as response:
                response.arrays["rows"].fill(1.0)  # stands in for copying a batch in and using it
                self.batches += 1
            await anyio.sleep(0.005)


def problem(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 2.0, (2, RUNS)), rng.uniform(1.0, 3.0, (1, RUNS))


async def main() -> None:
    system = create_ODE_system(
        ["dx = v", "dv = mu * (1 - x*x) * v - x"], states={"x": 1.0, "v": 0.0}, parameters={"mu": 1.5}
    )
    simulated = SimulatorBackend(total=SIMULATED_DEVICE) if BACKEND == "simulator" else None
    with simulated or contextlib.nullcontext("cuda") as backend:  # a backend passed in is closed by who made it
        async with MemoryManager(backend, headroom=CUBIE_HEADROOM) as mgr:
            loader, stop = Loader(), anyio.Event()
            mgr.register(loader, stream_group="load")
            held = await mgr.request(loader, {"cache": ArrayRequest((40 * 1024,), np.uint8, unchunkable=True)})
            memory = CubieMemoryManager(mgr)  # cubie's MemoryManager, on this loop's aiocubie manager
            solvers = {name: Solver(system, algorithm="euler", memory_manager=memory) for name in "ab"}
            results = {}

            async def run_solve(name: str, seed: int) -> None:
                results[name] = await solve(solvers[name], *problem(seed), **SETTINGS)

            async with anyio.create_task_group() as tg:
                tg.start_soon(loader.run, mgr, stop)
                async with anyio.create_task_group() as solves:
                    solves.start_soon(run_solve, "a", 1)
                    solves.start_soon(run_solve, "b", 2)
                stop.set()
            for name, seed in (("a", 1), ("b", 2)):
                params = solvers[name].kernel.run_params
                reference = Solver(system, algorithm="euler")  # cubie's own memory manager
                expected = reference.solve(*problem(seed), **SETTINGS)
                same = np.array(results[name].state).tobytes() == np.array(expected.state).tobytes()
                print(
                    f"solve {name}: {params.runs} runs in {params.num_chunks} chunks of {params.chunk_length}, "
                    f"{'identical to' if same else 'DIFFERENT from'} cubie's own memory manager"
                )
                reference.close()
                solvers[name].close()
            print(
                f"loader: {loader.batches} batches on the loop while the solves ran, beside a {held.arrays['cache'].nbytes} B cache"
            )
            mgr.release(held)
            stats = mgr.stats().groups
            print(
                f"one stats table: groups {sorted(stats)}; solver chunks {stats['solver'].chunks}, load requests {stats['load'].requests}"
            )
            print(mgr.summary())


if __name__ == "__main__":
    anyio.run(main)
