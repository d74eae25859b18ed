"""A cubie 0.17 solve through aiocubie.cubie against the same solve on cubie's own memory manager.

Issue 25's target: the adapter's wall time within 1.1x of cubie's own, one process, warm (each
manager's solver compiled and run once first; then solves alternate). Prints the medians and the
ratio. On a GPU by default; ``--runs`` sets the batch. Needs the cubie extra.
Run: python benchmarks/bench_cubie.py [--runs 100000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import aiocubie

BACKEND, WHY = aiocubie.select_backend()  # without a GPU: cubie's simulator (NUMBA_ENABLE_CUDASIM=1)

import numpy as np  # noqa: E402
from cubie import Solver, create_ODE_system  # noqa: E402

from aiocubie.cubie import CubieMemoryManager  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000 if BACKEND == "cuda" else 64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    system = create_ODE_system(
        ["dx = v", "dv = mu * (1 - x*x) * v - x"], states={"x": 1.0, "v": 0.0}, parameters={"mu": 1.5}
    )
    rng = np.random.default_rng(25)
    inits, params = rng.uniform(0.5, 2.0, (2, args.runs)), rng.uniform(1.0, 3.0, (1, args.runs))
    settings = {"duration": 1.0, "dt": 0.001 if BACKEND == "cuda" else 0.05, "save_every": 0.1}
    mm = CubieMemoryManager(backend="cuda" if BACKEND == "cuda" else aiocubie.simulator.SimulatorBackend(total=1 << 30))
    solvers = {
        "cubie": Solver(system, algorithm="euler"),
        "aiocubie": Solver(system, algorithm="euler", memory_manager=mm),
    }
    results = {name: solver.solve(inits, params, **settings) for name, solver in solvers.items()}  # compile, allocate
    same = np.array(results["cubie"].state).tobytes() == np.array(results["aiocubie"].state).tobytes()
    times: dict[str, list[float]] = {name: [] for name in solvers}
    for _ in range(args.repeats):
        for name, solver in solvers.items():
            start = time.perf_counter()
            solver.solve(inits, params, **settings)
            times[name].append(time.perf_counter() - start)
    own, ours = (statistics.median(times[name]) for name in ("cubie", "aiocubie"))
    print(f"{BACKEND}: {args.runs} runs, {args.repeats} warm solves each, bitwise identical: {same}")
    print(f"cubie's own manager {own * 1e3:.1f} ms, aiocubie.cubie {ours * 1e3:.1f} ms (medians): {ours / own:.2f}x")
    for solver in solvers.values():
        solver.close()
    mm.close()


if __name__ == "__main__":
    main()
