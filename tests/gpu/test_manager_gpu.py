"""The whole service on a real GPU: MemoryManager over the CUDA backend, on asyncio and trio.

Chunked batches are written chunk by chunk by a real kernel on the group's stream and
every element is checked on the host. Skipped without a GPU (see conftest.py).
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
from gpukit import RESOURCES, require, to_host

from aiocubie import ArrayRequest, MemoryManager, walk_chunks
from aiocubie.errors import UnknownAllocatorError

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


class Solver:
    """A component: one per requester."""


@pytest.fixture(params=["default", *RESOURCES])
def allocator(request: pytest.FixtureRequest) -> str:
    """Each allocator in turn, on the session's backend."""
    require(request.param)
    return str(request.param)


async def test_chunked_batch_written_by_kernel(cuda_backend: Any, kernels: Any, allocator: str) -> None:
    # A tiny manual proportion in active mode makes a 3 x 64 MB batch chunk on an 80 GB card.
    rows, runs = 4, 4_000_000  # values stay below 2**24: exact in float32
    async with MemoryManager(cuda_backend, mode="active", allocator=allocator) as mgr:
        solvers = [Solver() for _ in range(3)]
        for solver in solvers:
            mgr.register(solver, proportion=0.0001, stream_group="solve")
        request = {
            "out": ArrayRequest((rows, runs), np.float32, chunk_axis=1),
            "params": ArrayRequest((16,), np.float64, unchunkable=True, zero=True),
        }
        async with anyio.create_task_group() as tg:
            for solver in solvers:
                tg.start_soon(_solve, mgr, solver, request, kernels, rows, runs)
        assert mgr.stats().live_bytes == 0
        assert mgr.stats().groups["solve"].batches == 1  # all three asked: one batch, one plan


async def _solve(
    mgr: MemoryManager, solver: Solver, request: dict[str, ArrayRequest], kernels: Any, rows: int, runs: int
) -> None:
    async with mgr.request(solver, request) as response:
        assert response.chunks > 1
        assert np.array_equal(to_host(response.arrays["params"]), np.zeros(16))
        host = np.full((rows, runs), np.nan, np.float32)
        async for chunk in walk_chunks(response, outputs={"out": host}):
            out = chunk.device["out"]
            kernels.fill_chunk(response.stream, out, chunk.start, runs)
        expected = np.arange(1, runs + 1, dtype=np.float64)[None, :] + runs * np.arange(rows)[:, None]
        np.testing.assert_array_equal(host, expected.astype(np.float32))


async def test_copies_and_managed_prefetch(cuda_backend: Any) -> None:
    rng = np.random.default_rng()
    async with MemoryManager(cuda_backend) as mgr:
        solver = Solver()
        mgr.register(solver)
        request = {
            "d": ArrayRequest((1000, 37), np.float64),
            "m": ArrayRequest((1 << 20,), np.int32, kind="managed", unchunkable=True),
            "p": ArrayRequest((64,), np.float32, kind="pinned", unchunkable=True),
        }
        async with mgr.request(solver, request) as response:
            data = rng.standard_normal((1000, 37))
            back = np.empty_like(data)
            await mgr.host.to_device(solver, [data], [response.arrays["d"]])
            await mgr.host.from_device(solver, [response.arrays["d"]], [back])
            np.testing.assert_array_equal(back, data)
            managed = response.arrays["m"]
            mgr.host.advise(managed, "preferred_location", 0)
            mgr.host.advise(managed, "accessed_by", None)
            await mgr.host.prefetch(solver, managed, 0)
            await mgr.host.prefetch(solver, managed, None)
            await mgr.host.to_device(solver, [np.arange(managed.size, dtype=np.int32)], [managed])
            assert int(managed[-1]) == managed.size - 1
        assert mgr.stats().live_bytes == 0


async def test_set_allocator_resets_and_invalidates(cuda_backend: Any) -> None:
    pytest.importorskip("cupy")
    invalidated: list[str] = []
    async with MemoryManager(cuda_backend) as mgr:
        solver = Solver()
        mgr.register(solver, invalidate_hook=lambda: invalidated.append("solver"))
        await mgr.request(solver, {"a": ArrayRequest((1 << 20,), np.uint8)})
        with pytest.warns(Warning, match="resets the device context"):
            mgr.pool.set_allocator("cupy_async")
        assert invalidated == ["solver"]
        assert mgr.stats().live_bytes == 0 and mgr.pool.allocator == "cupy_async"
        with pytest.raises(UnknownAllocatorError, match="'nope'"):
            mgr.pool.set_allocator("nope")
        async with mgr.request(solver, {"a": ArrayRequest((1 << 20,), np.uint8, zero=True)}) as response:
            assert to_host(response.arrays["a"]).sum() == 0
        with pytest.warns(Warning):
            mgr.pool.set_allocator("default")
        assert invalidated == ["solver", "solver"]
