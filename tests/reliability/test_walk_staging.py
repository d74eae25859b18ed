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
from aiocubie import ArrayRequest, MemoryManager, SimulatorBackend, walk_chunks, walk_requests

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
