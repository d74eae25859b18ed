"""Reclaim hooks under attack: what a hook may call, and that nothing leaks or hangs whatever it does.

Issue 22 (round two) items 1, 5 and 6, on asyncio, trio and uvloop. A reclaim hook runs on the
allocation's path: it may release memory (release, free, free_all, unregister,
change_stream_group); it may not allocate through the manager nor reset the context.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from _reliability import LOOPS, Component, outcome

from aiocubie import (
    ArrayRequest,
    ArrayResponse,
    ManagerStateError,
    MemoryManager,
    OutOfMemoryError,
    RegistrationError,
    SimulatorBackend,
)

pytestmark = pytest.mark.anyio

TOTAL = 1 << 20


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def vec(n: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((n,), "float64")}


def balanced(mgr: MemoryManager) -> None:
    """Every out-of-memory ended recovered or failed, once."""
    recovery = mgr.stats().recovery
    assert recovery.out_of_memory == recovery.recovered + recovery.failed, recovery


# -- item 1: a hook that unregisters the requester, served in the caller's task ------------
async def test_a_hook_that_unregisters_the_requester_leaks_nothing(drained) -> None:
    sim = SimulatorBackend(TOTAL)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0) as mgr:  # served in the caller's task
            part = Component("part")
            mgr.register(part)

            def hook(nbytes: int) -> int:
                mgr.unregister(part)  # the request's ticket ends here
                sim.occupy(4096)  # another process took memory since the plan's reading
                return 0

            mgr.add_reclaim_hook(hook)
            sim.faults.inject("oom", times=3)  # the try, the retry after the cache, the retry after the hook
            result = await outcome(mgr, part, vec(100))
            assert isinstance(result, RegistrationError), result
            sim.occupy(-4096)
            assert mgr.stats().live_bytes == sim.used == 0
            balanced(mgr)
            await drained(mgr, sim)
