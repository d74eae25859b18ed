"""The reliability checks that also run on a real GPU (``backend="cuda"``), kept small.

Skipped without a usable GPU (see ``aiocubie.gpu_status``); the lead runs them on the device
machine with scripts/gpu-check. They must not depend on simulator-only hooks such as faults.
"""

from __future__ import annotations

import random

import anyio
import pytest
from _reliability import Component, pending

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager, gpu_status
from aiocubie.errors import ContextResetError

USABLE, WHY = gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.anyio, pytest.mark.skipif(not USABLE, reason=f"no GPU: {WHY}")]

MiB = 1 << 20


def block(rows: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((rows, 4096), "float32", chunk_axis=1, zero=True)}


async def test_gpu_cancellation_storm_leaks_nothing(drained) -> None:
    rng = random.Random(5)
    with anyio.fail_after(60):
        async with MemoryManager("cuda", mode="active", policy="wait", batch_window=0.001) as mgr:
            members = [Component(i) for i in range(4)]
            for member in members:
                mgr.register(member, proportion=0.02)
            served = 0

            async def worker(member: Component) -> None:
                nonlocal served
                for _ in range(8):
                    with anyio.move_on_after(rng.uniform(0, 0.005)):
                        async with mgr.request(member, block(rng.randint(1, 256))) as response:
                            assert response.arrays["x"].shape[0] >= 1
                            served += 1
                            await anyio.sleep(rng.uniform(0, 0.001))

            async with anyio.create_task_group() as tg:
                for index in range(64):
                    tg.start_soon(worker, members[index % 4])
            assert mgr.stats().groups["default"].peak_bytes <= sum(mgr.budget.cap(m) for m in members)
            await drained(mgr)


async def test_gpu_reset_in_flight_and_queued(drained) -> None:
    with anyio.fail_after(60):
        async with MemoryManager("cuda", batch_window=30) as mgr:
            calls = []
            members = [Component(i) for i in range(3)]
            for member in members:
                mgr.register(member, invalidate_hook=lambda m=member: calls.append(m))
            results: list[object] = []

            async def ask(member: Component) -> None:
                try:
                    results.append(await mgr.request(member, block(64)))
                except ContextResetError as exc:
                    results.append(exc)

            async with anyio.create_task_group() as tg:
                for member in members[:2]:  # the third never asks: the batch stays queued
                    tg.start_soon(ask, member)
                while pending(mgr) < 2:
                    await anyio.sleep(0.001)
                mgr.pool.invalidate_all()
                assert sorted(m.tag for m in calls) == [0, 1, 2]
                mgr.groups.flush()
            assert all(isinstance(r, ArrayResponse) for r in results), results
            for response in results:
                mgr.release(response)  # type: ignore[arg-type]
            await drained(mgr)
