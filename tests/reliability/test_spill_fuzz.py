"""A seeded fuzz of spilling: caches used and left idle, batches that make them spill, cancellations.

Every cache read back holds what was written into it, the device never holds more than it has, and
once everything is released the accounting and the pinned host memory are back to zero.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import numpy as np
import pytest
from simkit import LOOPS, Part

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.errors import AiocubieError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

TOTAL = 4_000_000


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy", ["chunk", "wait"])
async def test_spilling_fuzz(seed: int, policy: str) -> None:
    rng = random.Random(seed)
    peak = 0
    with SimulatorBackend(total=TOTAL) as sim:
        async with MemoryManager(sim, policy=policy, headroom=0.0) as mgr:

            async def component(index: int) -> None:
                nonlocal peak
                me = Part()
                mgr.register(me, stream_group=f"g{index % 2}")
                n = rng.randrange(20_000, 120_000)
                cache = await mgr.request(me, {"c": ArrayRequest((n,), "f4", unchunkable=True, spillable=True)})
                value = float(index)
                async with cache.use() as arrays:
                    arrays["c"].set(np.full(n, value, np.float32))
                for _ in range(rng.randrange(3, 8)):
                    with anyio.move_on_after(rng.choice([0.0005, 0.002, 1.0])):  # some steps are cancelled
                        try:
                            async with await mgr.request(me, {"x": ArrayRequest((rng.randrange(1, 400_000),), "f4")}):
                                peak = max(peak, sim.used)
                                await anyio.sleep(rng.random() * 0.002)
                            async with cache.use() as arrays:
                                arrays["c"].set(np.full(n, value + 1, np.float32))
                                value += 1
                        except AiocubieError:
                            pass
                    peak = max(peak, sim.used)
                async with cache.use() as arrays:
                    held = arrays["c"].get()
                    assert (held == value).all()  # the last write (a cancelled step wrote nothing)
                cache.release()
                mgr.unregister(me)

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for index in range(6):
                        tg.start_soon(component, index)
            assert mgr.stats().live_bytes == 0
            assert mgr.statistics().spilled == 0
            assert mgr.stats().spill.spills > 0  # the fuzz spilled (6 to 14 times a seed)
            assert sim.device.pinned_pool.in_use == 0
    assert peak <= TOTAL
