"""Walks whose pageable chunks are packed on staging threads, attacked (review of issue 21).

A staging buffer goes back to the pinned pool when the walk ends, and the next walk may be handed
it at once: a staging thread that still packs into it then writes another walk's data. These
check that a walk ends only after its staging threads, however it ends, and that walks of odd
views give numpy's bytes. On asyncio, trio and uvloop.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest
from _reliability import LOOPS

import aiocubie._backends._staging as staging
from aiocubie import ArrayRequest, Engines, MemoryManager, ReleasedError, SimulatorBackend, walk_chunks, walk_requests

pytestmark = pytest.mark.anyio


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


async def test_a_walk_cancelled_while_it_waits_for_a_pack_waits_for_the_staging_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the walk popped the pack it awaited from the packs _quiesce waits for: cancelled there, it
    # gave the staging buffer back while the staging thread was still to write it
    started, gate = threading.Event(), threading.Event()
    packing = {"done": False}
    real = staging.host_copy

    def slow_pack(dst: Any, src: Any) -> None:
        started.set()
        gate.wait(10)
        real(dst, src)
        packing["done"] = True

    shape = (4, 64)
    async with MemoryManager(SimulatorBackend(1 << 20)) as mgr:
        solver = object()
        mgr.register(solver)
        x = np.arange(256, dtype=np.float32).reshape(shape)
        requests = walk_requests({"x": ArrayRequest(shape, np.float32, chunk_axis=1)}, 2)
        async with mgr.request(solver, requests) as response:
            monkeypatch.setattr(staging, "host_copy", slow_pack)
            with anyio.CancelScope() as scope:

                async def cancel_once_packing() -> None:
                    await anyio.to_thread.run_sync(started.wait)
                    threading.Timer(0.3, gate.set).start()  # the walk must wait this long
                    scope.cancel()

                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(cancel_once_packing)
                    async for _ in walk_chunks(response, inputs={"x": x}):
                        pass
            assert scope.cancelled_caught
            assert packing["done"], "the walk ended (and gave its staging buffer back) while a staging thread packed it"
            assert mgr.stats().pinned.in_use == 0


@pytest.mark.xfail(
    strict=True,
    reason="a walk's copies queued ahead on its copy streams are not ordered before a release: the "
    "blocks are freed (on a GPU: back to the pool, on the group's stream only) while the next chunks' "
    "copies in still write them, and the simulator's copy engines write freed memory without a word",
)
async def test_copies_queued_ahead_never_write_a_block_the_body_released() -> None:
    from aiocubie._backends._sim._arrays import host_data

    runs, row = 12, 1 << 12
    shape = (runs, row)
    engines = Engines(h2d_bandwidth=1e9, d2h_bandwidth=1e9, copy_latency=0.2)  # copies still queued
    sim = SimulatorBackend(7 * 4 * row, engines=engines)  # chunks of 2 runs at depth 3
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        x = mgr.create_host_array(shape, np.float32, "pinned")
        x[...] = 7
        response = await mgr.request(solver, walk_requests({"x": ArrayRequest(shape, np.float32, chunk_axis=0)}, 3))
        assert response.chunks == 6
        buffers = [host_data(response.buffer("x", slot)) for slot in range(3)]
        with pytest.raises(ReleasedError):
            async for chunk in walk_chunks(response, inputs={"x": x}):
                if chunk.index == 0:  # chunks 0 to 2 are still queued on the copy-in stream
                    mgr.release(response)
        for slot in range(3):
            written = np.unique(buffers[slot].view(np.uint8))
            assert written.tolist() == [0xFF], f"chunk buffer {slot} was written after it was freed"
