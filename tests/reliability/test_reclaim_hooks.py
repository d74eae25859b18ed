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

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.errors import ManagerStateError, RegistrationError
from aiocubie.simulator import SimulatorBackend

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

            mgr.pool.add_reclaim_hook(hook)
            sim.faults.inject("oom", times=3)  # the try, the retry after the cache, the retry after the hook
            result = await outcome(mgr, part, vec(100))
            assert isinstance(result, RegistrationError), result
            sim.occupy(-4096)
            assert mgr.stats().live_bytes == sim.used == 0
            balanced(mgr)
            await drained(mgr, sim)


# -- items 5 and 6: a hook may release memory; it may not allocate or reset the context -----
async def test_a_hook_that_allocates_is_refused_and_the_counters_add_up(drained) -> None:
    sim = SimulatorBackend(TOTAL)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0) as mgr:
            part, spare = Component("part"), Component("spare")
            mgr.register(part, stream_group="g")
            mgr.register(spare, stream_group="h")
            refused: list[Exception] = []

            def hook(nbytes: int) -> int:
                try:
                    mgr.allocate(spare, vec(10))  # re-entered recovery until RecursionError
                except Exception as exc:
                    refused.append(exc)
                    raise
                return 0

            mgr.pool.add_reclaim_hook(hook)
            sim.faults.inject("oom", times=50)  # every allocation is out of memory
            result = await outcome(mgr, part, vec(100))
            sim.faults.clear()
            assert isinstance(result, ManagerStateError), result
            assert [type(exc) for exc in refused] == [ManagerStateError]
            message = str(result)
            assert "allocate() from a reclaim hook" in message and "group 'g'" in message
            assert "800 B" in message and "mgr.release" in message
            recovery = mgr.stats().recovery
            assert (recovery.out_of_memory, recovery.hook_calls, recovery.failed) == (1, 1, 1)
            balanced(mgr)
            async with mgr.request(part, vec(100)) as response:  # the manager goes on serving
                assert isinstance(response, ArrayResponse)
            await drained(mgr, sim)


async def test_an_allocating_and_an_invalidating_hook_never_hang_the_exit(drained) -> None:
    sim = SimulatorBackend(TOTAL)
    invalidated: list[str] = []
    with anyio.fail_after(10):  # leaving `async with mgr` hung on asyncio
        async with MemoryManager(sim, batch_window=0) as mgr:
            part = Component("part")
            mgr.register(part, invalidate_hook=lambda: invalidated.append("part"))

            def allocating(nbytes: int) -> int:
                try:
                    mgr.allocate(part, vec(10))
                except ManagerStateError:
                    pass  # a hook may catch the refusal and go on
                return 0

            def invalidating(nbytes: int) -> int:
                mgr.pool.invalidate_all()
                return 0

            mgr.pool.add_reclaim_hook(allocating)
            mgr.pool.add_reclaim_hook(invalidating)
            sim.faults.inject("oom", times=50)
            result = await outcome(mgr, part, vec(100))
            sim.faults.clear()
            assert isinstance(result, ManagerStateError), result
            assert "invalidate_all() from a reclaim hook" in str(result)
            assert invalidated == [] and sim.resets == 0  # refused before anything was reset
            balanced(mgr)
            await drained(mgr, sim)


@pytest.mark.parametrize("call", ["set_allocator", "reinit_streams"])
async def test_a_hook_that_resets_the_context_is_refused_naming_the_group(call: str, drained) -> None:
    sim = SimulatorBackend(TOTAL)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0) as mgr:
            part = Component("part")
            mgr.register(part, stream_group="solve")
            stream = mgr.groups.stream(part)

            def hook(nbytes: int) -> int:
                if call == "set_allocator":
                    mgr.pool.set_allocator("cupy")
                else:
                    mgr.groups.reinit_streams()
                return 0

            mgr.pool.add_reclaim_hook(hook)
            sim.faults.inject("oom", times=3)  # the hook's retry would have succeeded
            result = await outcome(mgr, part, vec(100))
            assert isinstance(result, ManagerStateError), result
            message = str(result)
            assert f"{call}(" in message and "from a reclaim hook" in message and "group 'solve'" in message
            assert "1 request(s)" in message and "reinit_streams() after" not in message
            assert mgr.pool.allocator == "driver" and sim.resets == 0 and mgr.groups.stream(part) is stream
            balanced(mgr)
            assert mgr.stats().recovery.failed == 1
            async with mgr.request(part, vec(100)) as response:  # served on the same stream
                assert response.stream is stream
            await drained(mgr, sim)
