"""aiocubie from plain asyncio code (pytest-asyncio): gather, wait_for timeouts, task.cancel().

These use asyncio's own primitives, not anyio's, as an asyncio application would; the
timeouts only bound waits, nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.simulator import SimulatorBackend

TOTAL = 1_000_000
HANG_GUARD = 10


class Part:
    """A component to register."""


@pytest.fixture
def sim() -> Iterator[SimulatorBackend]:
    backend = SimulatorBackend(total=TOTAL, latency=0.001)
    yield backend
    backend.close()


@pytest.mark.asyncio
async def test_gather_with_wait_for(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        parts = [Part() for _ in range(4)]
        for i, part in enumerate(parts):
            mgr.register(part, stream_group=f"g{i % 2}")
        requests = [mgr.request(part, {"x": ArrayRequest((10 + i % 2, 3), "float32")}) for i, part in enumerate(parts)]
        responses = await asyncio.wait_for(asyncio.gather(*requests), HANG_GUARD)
        assert [r.arrays["x"].shape for r in responses] == [(10, 3), (11, 3), (10, 3), (11, 3)]
        host = np.arange(30, dtype=np.float32).reshape(10, 3)
        back = mgr.host.array((10, 3), np.float32, "pinned")
        await asyncio.wait_for(mgr.host.to_device(parts[0], [host], [responses[0].arrays["x"]]), HANG_GUARD)
        await asyncio.wait_for(mgr.host.from_device(parts[0], [responses[0].arrays["x"]], [back]), HANG_GUARD)
        np.testing.assert_array_equal(back, host)
        for response in responses:
            mgr.release(response)
        assert mgr.stats().live_bytes == 0 and sim.used == 0


@pytest.mark.asyncio
async def test_wait_for_timeout_withdraws_the_request(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, batch_window=60) as mgr:
        asker, absent = Part(), Part()
        mgr.register(asker, stream_group="g", name="asker")
        mgr.register(absent, stream_group="g")  # never asks: the batch stays open for its window
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(mgr.request(asker, {"x": ArrayRequest(100, "float64")}), 0.05)
        assert mgr.stats().instances["asker"].cancellations == 1
        assert sim.used == 0
        # the withdrawn request does not linger: the next batch holds only what is asked now
        task = asyncio.create_task(asyncio.wait_for(mgr.request(asker, {"x": ArrayRequest(7, "float64")}), HANG_GUARD))
        while mgr.stats().groups["g"].requests < 2:
            await asyncio.sleep(0.001)
        mgr.groups.flush("g")
        response = await task
        assert response.arrays["x"].shape == (7,) and sim.used == 56
        mgr.release(response)
    assert mgr.stats().live_bytes == 0 and sim.used == 0


@pytest.mark.asyncio
async def test_task_cancelled_after_ready_before_it_resumes(sim: SimulatorBackend) -> None:
    task: asyncio.Task[ArrayResponse] | None = None
    hooked = asyncio.Event()

    def cancel_now(response: ArrayResponse) -> None:
        # the request is resolved but its task has not run yet: cancel it right here
        assert task is not None and not task.done()
        task.cancel()
        hooked.set()

    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part, ready_hook=cancel_now, name="p")
        task = asyncio.create_task(mgr.request(part, {"x": ArrayRequest(1000, "float64")}).__aenter__())
        await asyncio.wait_for(hooked.wait(), HANG_GUARD)
        with pytest.raises(asyncio.CancelledError):
            await task
        # the arrays were allocated and the request was ready, but nobody will ever see them
        assert mgr.stats().live_bytes == 0 and sim.used == 0
        assert mgr.stats().instances["p"].cancellations == 1
