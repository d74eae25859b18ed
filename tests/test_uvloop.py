"""The service on uvloop: batches, chunking, cancellation and the thread-safe wake-up.

uvloop replaces asyncio's loop (the completion bridge then wakes it with uvloop's own
call_soon_threadsafe); everything else must behave exactly as on asyncio.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.simulator import SimulatorBackend

pytest.importorskip("uvloop")
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    return "asyncio", {"use_uvloop": True}


class Component:
    """A registered requester."""


async def test_batched_chunked_and_cancelled_requests_on_uvloop() -> None:
    import asyncio

    import uvloop

    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    sim = SimulatorBackend(total=100_000, latency=0.0005)  # events complete on a worker thread
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=1.0) as mgr:
            parts = [Component() for _ in range(4)]
            for part in parts:
                mgr.register(part, stream_group="g")
            plans = []

            async def ask(part: Component) -> None:
                request = {"x": ArrayRequest((4, 5_000), np.float32, chunk_axis=1)}  # 80 kB each
                async with mgr.request(part, request) as response:
                    plans.append((response.chunks, response.chunk_length))

            async with anyio.create_task_group() as tg:
                for part in parts:
                    tg.start_soon(ask, part)
            assert len(plans) == 4 and len(set(plans)) == 1  # one batch, one plan, lockstep
            assert plans[0][0] > 1  # 320 kB asked of a 100 kB device: chunked

            with anyio.move_on_after(0.0001):  # cancelled while queued or in flight
                await mgr.request(parts[0], {"y": ArrayRequest((10,), np.int8)})
            await mgr.groups.sync(parts[0])  # after the request's batch on the same stream
            assert mgr.stats().live_bytes == 0 and sim.used == 0  # withdrawn, or freed on resolving
