"""Record an allocation history, recover from out-of-memory, and draw the history.

A loader and two solvers work through batches on a 4 MiB simulated device whose allocator
caches freed blocks (as CuPy's pool does); a lookup cache holds a table it can drop, through a
reclaim hook, when memory runs out. A batch larger than any block the pool cached finds no
room on the device: the manager frees the pool's cached blocks and goes on. Later another process
takes most of the memory: the next batch finds no room even so, the manager calls the reclaim
hook, and the batch goes on. Writes history.json, history.html (self-contained) and, with matplotlib, history.png
into OUT_DIR (default: a new temporary folder, never the current directory); prints the memory summary.
Run: python examples/history.py [OUT_DIR]     (README's picture: python examples/history.py docs)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio
import numpy as np

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager, walk_chunks
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import History, render_history

MiB = 1 << 20


class Stage:
    """A component that walks its batches chunk by chunk."""

    async def work(self, mgr: MemoryManager, runs: int) -> None:
        x = np.ones((8, runs), np.float32)
        request = {"x": ArrayRequest(x.shape, x.dtype, chunk_axis=1)}
        async with mgr.request(self, request) as response:
            async for _ in walk_chunks(response, inputs={"x": x}):
                await anyio.sleep(0.002)  # the kernel's time


class LookupCache:
    """Holds a table on the device while memory allows; its reclaim hook drops it."""

    def __init__(self, mgr: MemoryManager) -> None:
        self.mgr = mgr
        self.table: ArrayResponse | None = None

    def fill(self) -> None:
        self.table = self.mgr.allocate(self, {"table": ArrayRequest((MiB // 4,), np.float32)})

    def reclaim(self, nbytes: int) -> int:
        if self.table is None:
            return 0
        self.mgr.release(self.table)
        self.table = None
        return MiB


async def record() -> tuple[History, str]:
    with SimulatorBackend(4 * MiB, latency=0.0002, allocator="cupy") as sim:
        async with MemoryManager(sim, free_cache_seconds=3600) as mgr:
            mgr.record_history()
            loader, solver_a, solver_b = Stage(), Stage(), Stage()
            cache = LookupCache(mgr)
            mgr.register(loader, stream_group="load", name="loader")
            mgr.register(solver_a, stream_group="solve", name="solver-a")
            mgr.register(solver_b, stream_group="solve", name="solver-b")
            mgr.register(cache, stream_group="cache", name="lookup-cache")
            mgr.pool.add_reclaim_hook(cache.reclaim)
            cache.fill()
            for step, runs in enumerate((8_000, 30_000, 16_000, 24_000)):
                if step == 3:  # the pool is emptied, and another process takes all but 900 KiB, unseen
                    sim.resource.release_cached()
                    sim.occupy(sim.device.memory_info().free - 900 * 1024)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(loader.work, mgr, runs)
                    tg.start_soon(solver_a.work, mgr, runs)
                    tg.start_soon(solver_b.work, mgr, runs // 2)
                await anyio.sleep(0.01)
            return mgr.history(), mgr.summary()


def main(out_dir: Path) -> None:
    history, summary = anyio.run(record)
    out_dir.mkdir(parents=True, exist_ok=True)
    history.to_json(out_dir / "history.json")
    print(summary)
    print(f"recorded {len(history.events)} events; wrote {render_history(history, out_dir / 'history.html')}")
    try:
        print(f"wrote {render_history(history, out_dir / 'history.png')}")
    except Exception as exc:  # no matplotlib: the HTML page is enough
        print(f"no picture: {exc}")


if __name__ == "__main__":
    # the files go to the folder named on the command line, else to a temporary one (never the
    # current directory: running an example must not litter where you stand)
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="aiocubie-history-")))
