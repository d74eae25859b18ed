"""Plot the live device bytes of each stream group over time, from Recorder snapshots.

A loader and a solver (two stream groups) work through batches on a 1 MiB simulated device
with some stream latency, while a Recorder samples mgr.stats(). Needs matplotlib
(pip install 'aiocubie[plot]'); without it, it says so and skips the plot.
Run: python examples/plot_stats.py [out.png]
"""

from __future__ import annotations

import sys

import anyio
import numpy as np

from aiocubie import ArrayRequest, MemoryManager, walk_chunks
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import Recorder


class Stage:
    async def work(self, mgr: MemoryManager, runs: int) -> None:
        x = np.ones((8, runs), np.float32)
        request = {"x": ArrayRequest(x.shape, x.dtype, chunk_axis=1)}
        async with mgr.request(self, request) as response:
            async for _ in walk_chunks(response, inputs={"x": x}):
                await anyio.sleep(0.002)  # the kernel's time


async def record() -> Recorder:
    with SimulatorBackend(1 << 20, latency=0.0005) as sim:
        async with MemoryManager(sim, mode="active") as mgr:
            loader, solver = Stage(), Stage()
            mgr.register(loader, stream_group="load", name="loader")
            mgr.register(solver, stream_group="solve", name="solver")
            async with Recorder(mgr, interval=0.002) as recorder:
                async with anyio.create_task_group() as tg:
                    for runs in (10_000, 40_000, 20_000):
                        tg.start_soon(loader.work, mgr, runs)
                        tg.start_soon(solver.work, mgr, runs * 2)
                        await anyio.sleep(0.02)
    return recorder


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "aiocubie-stats.png"
    recorder = anyio.run(record)
    peaks = {group: max(recorder.series(group)[1]) for group in ("load", "solve")}
    print(f"recorded {len(recorder.snapshots)} snapshots; peak live bytes per group: {peaks}")
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'aiocubie[plot]'): skipping the plot")
        return 0
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for group in ("load", "solve"):
        times, live = recorder.series(group)
        ax.step([t * 1e3 for t in times], [b / 1024 for b in live], where="post", label=group)
    ax.set(xlabel="time (ms)", ylabel="live device memory (KiB)", title="aiocubie: live bytes per stream group")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
