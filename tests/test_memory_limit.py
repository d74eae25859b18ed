"""memory_limit: every kind that takes device memory counts against it (device and managed)."""

from __future__ import annotations

import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.errors import PlanningError
from aiocubie.simulator import SimulatorBackend

KiB, MiB = 1 << 10, 1 << 20


class Component:
    """A registrable stand-in for a solver."""


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["device", "managed"])
async def test_memory_limit_counts_every_kind_that_takes_device_memory(kind: str) -> None:
    backend = SimulatorBackend(8 * MiB)
    mgr = MemoryManager(backend, memory_limit=1 * MiB, free_cache_seconds=0, batch_window=0)
    solver = Component()
    mgr.register(solver)
    request = {"x": ArrayRequest((600 * KiB,), np.uint8, unchunkable=True, kind=kind)}
    async with mgr:
        held = [await mgr.request(solver, request)]
        assert mgr.pool.memory_info().free <= 1 * MiB - 600 * KiB
        for _ in range(3):  # a second 600 KiB does not fit under the 1 MiB limit, of either kind
            with pytest.raises(PlanningError, match="unchunkable"):
                held.append(await mgr.request(solver, request))
        assert len(held) == 1
        mgr.release(held[0])
        assert mgr.pool.memory_info().free == 1 * MiB
    mgr.close()
    backend.close()
