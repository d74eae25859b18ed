"""A chunked workload spread over Dask workers, each serving its tasks from its own aiocubie manager.

The client splits a matrix into pieces and maps an ``async def`` task over them; Dask places the
tasks, and each worker's manager (from ``aiocubie.dask.ManagerPlugin``) plans each piece within
the task's budget, chunk by chunk. Runs on a LocalCluster of in-process workers, on the GPU when
there is one and on the simulator otherwise. For one worker per GPU, start each worker with its
own CUDA_VISIBLE_DEVICES (dask-cuda's LocalCUDACluster does): each manager drives its device 0.
Needs the dask extra: pip install 'aiocubie[dask]'. Run: python examples/dask_chunked.py
"""

from __future__ import annotations

import asyncio

import numpy as np

try:
    from distributed import Client, LocalCluster
except ModuleNotFoundError as exc:  # the extra is not installed: say how to get it
    raise SystemExit(f"this example needs Dask ({exc}): pip install 'aiocubie[dask]'") from None

import aiocubie
from aiocubie import ArrayRequest, walk_chunks
from aiocubie.dask import ManagerPlugin, get_manager

PIECES, ROWS, COLS = 8, 4096, 256
BUDGET = 2 << 20  # bytes each task may hold on its device: a piece (4 MiB in, 4 MiB out) takes chunks


class Scaler:
    """The component of one task: computes 2x + 1 over its piece."""


async def scale(index: int, piece: np.ndarray) -> tuple[str, int, np.ndarray]:
    mgr = get_manager()  # this worker's manager, running on this worker's event loop
    scaler = Scaler()
    mgr.register(scaler, stream_group=f"piece-{index}", proportion=BUDGET / mgr.pool.memory_info().total)
    out = mgr.host.array(piece.shape, piece.dtype)
    requests = {"x": ArrayRequest(piece.shape, piece.dtype), "y": ArrayRequest(piece.shape, piece.dtype)}
    async with mgr.request(scaler, requests) as response:
        async for chunk in walk_chunks(response, inputs={"x": piece}, outputs={"y": out}):
            with mgr.on_device(), aiocubie.current_cupy_stream(chunk.stream):
                chunk.device["y"][...] = chunk.device["x"] * 2 + 1
    mgr.unregister(scaler)
    return mgr.backend.name, response.chunks, out


async def main() -> None:
    backend = "cuda" if aiocubie.gpu_status()[0] else "simulator"
    data = np.random.default_rng(0).random((PIECES * ROWS, COLS), dtype=np.float32)
    async with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, processes=False, asynchronous=True, dashboard_address=None
        ) as cluster,
        Client(cluster, asynchronous=True) as client,
    ):
        await client.register_plugin(ManagerPlugin(backend=backend, mode="active", policy="wait"))
        pieces = np.split(data, PIECES)
        scattered = await client.scatter(pieces)  # data goes to the workers once, not in the task graph
        futures = client.map(scale, range(PIECES), scattered)
        results = await client.gather(futures)
        workers = {w for ws in (await client.who_has(futures)).values() for w in ws}
    for index, (name, chunks, out) in enumerate(results):
        assert np.allclose(out, pieces[index] * 2 + 1)
        print(f"piece {index}: {ROWS} rows in {chunks} chunks on {name}")
    print(f"{PIECES} pieces on {len(workers)} worker(s), every result correct")


if __name__ == "__main__":
    asyncio.run(main())
