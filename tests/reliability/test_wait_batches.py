"""Batches that cannot be planned whole: they shrink to what fits, and a request fails alone.

Issue 22 (round two) item 2 and the wait policy's self-deadlock, on asyncio, trio and uvloop.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from _reliability import LOOPS, Component, outcome

from aiocubie import AiocubieWarning, ArrayRequest, ArrayResponse, MemoryManager, SimulatorBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def unchunkable(nbytes: float) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((int(nbytes) // 4,), "float32", unchunkable=True)}


def waiting(mgr: MemoryManager) -> int:
    """Tickets queued, being planned or waiting for memory."""
    return sum(g.queued + g.planning for g in mgr.statistics().groups.values())


@pytest.mark.parametrize("policy", ["wait", "chunk"])
async def test_a_batch_that_fits_only_in_part_shrinks_and_each_request_is_served(policy: str, drained) -> None:
    # the reproduction: a holder keeps 55% of a 64 MiB device (proportion 0.6); four members of
    # its group (0.05 each) each ask for 30% unchunkable; two fit at once, not four
    total = 64 * MiB
    sim = SimulatorBackend(total)
    with anyio.fail_after(10):
        async with MemoryManager(sim, mode="active", policy=policy) as mgr:
            holder = Component("holder")
            mgr.register(holder, proportion=0.6, stream_group="g")
            askers = [Component(i) for i in range(4)]
            for asker in askers:
                mgr.register(asker, proportion=0.05, stream_group="g")
            held = mgr.allocate_all(holder, unchunkable(0.55 * total))
            if policy == "chunk":  # it does not wait: room for two of the four from the start
                mgr.release(held)
            results: list[object] = []

            async def ask(asker: Component) -> None:
                result = await outcome(mgr, asker, unchunkable(0.3 * total))
                results.append(result)
                if isinstance(result, ArrayResponse):
                    await anyio.sleep(0.01)
                    mgr.release(result)

            async with anyio.create_task_group() as tg:
                for asker in askers:
                    tg.start_soon(ask, asker)
                if policy == "wait":
                    while waiting(mgr) < 4:
                        await anyio.sleep(0.001)
                    await anyio.sleep(0.02)
                    assert results == []  # waiting, not failed
                    mgr.release(held)
            if policy == "wait":  # nothing starves: every one is served in the end
                assert all(isinstance(r, ArrayResponse) for r in results), results
            else:  # chunk: served while it fits, and a request that does not fails alone
                assert sum(isinstance(r, ArrayResponse) for r in results) >= 2, results
            assert len(results) == 4
            await drained(mgr, sim)
