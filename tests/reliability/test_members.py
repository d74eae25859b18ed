"""Collected members and their hooks (issue 11, items 3 to 7).

Hooks never keep an instance alive (a bound method of the instance, or the instance itself, is
held weakly); a collected member is reaped at once on the loop thread, without waiting for
another manager call, so waiting batches and open batches go on; async hooks of every form run.
"""

from __future__ import annotations

import gc
import random
import threading
import weakref
from typing import Any

import anyio
import pytest
from _reliability import LOOPS, SEEDS, Component, MiB, block, outcome, pending, scale, settle

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


class Hooked:
    """A component whose hooks are its own methods (sync or async)."""

    def __init__(self) -> None:
        self.ready: list[ArrayResponse] = []
        self.invalidated = 0

    def on_ready(self, response: ArrayResponse) -> None:
        self.ready.append(response)

    async def on_ready_async(self, response: ArrayResponse) -> None:
        await anyio.sleep(0)
        self.ready.append(response)

    def on_invalidate(self) -> None:
        self.invalidated += 1

    async def on_invalidate_async(self) -> None:
        await anyio.sleep(0)
        self.invalidated += 1


class CallableHooked(Hooked):
    """A component that is its own ready hook."""

    def __call__(self, response: ArrayResponse) -> None:
        self.ready.append(response)


class AsyncCall:
    """A hook object with ``async def __call__``."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, *args: object) -> None:
        await anyio.sleep(0)
        self.calls += 1


async def eventually(condition: Any, timeout: float = 5) -> None:
    """Wait (sleeping only: no manager call) until ``condition()`` holds."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.001)


# -- item 3: hooks that are bound methods do not keep the instance alive ---------------------
@pytest.mark.parametrize("ready", ["on_ready", "on_ready_async", "self"])
@pytest.mark.parametrize("invalidate", ["on_invalidate", "on_invalidate_async"])
async def test_bound_method_hooks_do_not_keep_the_instance_alive(ready: str, invalidate: str, drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    async with MemoryManager(sim, batch_window=0) as mgr:
        comp = CallableHooked()
        hook = comp if ready == "self" else getattr(comp, ready)
        mgr.register(comp, ready_hook=hook, invalidate_hook=getattr(comp, invalidate), stream_group="solo")
        await mgr.request(comp, block())  # dropped: the ledger holds the arrays
        await eventually(lambda c=comp: c.ready)
        mgr.pool.invalidate_all()
        await eventually(lambda c=comp: c.invalidated == 1)
        await mgr.request(comp, block())
        await eventually(lambda c=comp: len(c.ready) == 2)  # a running hook task holds its method
        assert sim.used > 0
        ref = weakref.ref(comp)
        del comp, hook
        gc.collect()
        assert ref() is None
        await eventually(lambda: sim.used == 0)  # reaped and freed, without another manager call
        assert mgr.groups.members() == {}
        await drained(mgr, sim)


# -- item 4: pool proportions right after a collection ---------------------------------------
async def test_pool_proportions_right_after_a_collection() -> None:
    sim = SimulatorBackend(64 * MiB)
    async with MemoryManager(sim) as mgr:
        manual, auto, keeper = Component(), Component(), Component()
        mgr.register(manual, proportion=0.3)
        mgr.register(auto)
        mgr.register(keeper, proportion=0.2)
        assert mgr.budget.manual_pool == pytest.approx(0.5)
        del manual
        assert mgr.budget.manual_pool == pytest.approx(0.2)
        assert mgr.budget.auto_pool == pytest.approx(0.8)
        del auto
        assert mgr.budget.auto_pool == 0
    # and on a manager that is not running (reaped by the property itself)
    mgr = MemoryManager(sim)
    manual = Component()
    mgr.register(manual, proportion=0.4)
    del manual
    assert mgr.budget.manual_pool == 0


# -- item 5: under policy wait, a collected holder's arrays are reclaimed at once -----------
@pytest.mark.parametrize("where", ["loop thread", "other thread"])
async def test_collected_holder_frees_a_waiter_without_another_manager_call(where: str, drained) -> None:
    sim = SimulatorBackend(4 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, mode="active", policy="wait", batch_window=0) as mgr:
            holder, waiter = Component("holder"), Component("waiter")
            mgr.register(holder)
            mgr.register(waiter)
            mgr.allocate(holder, {"x": ArrayRequest((3 * MiB,), "u1", unchunkable=True)})
            results: list[object] = []

            async def ask() -> None:
                results.append(await outcome(mgr, waiter, {"x": ArrayRequest((2 * MiB,), "u1", unchunkable=True)}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await eventually(lambda: any(g.planning for g in mgr.statistics().groups.values()))
                box = [holder]
                del holder
                if where == "loop thread":
                    box.clear()
                else:  # the last reference dies in another thread: the finalizer runs there
                    thread = threading.Thread(target=box.clear)
                    thread.start()
                    thread.join()
                await eventually(lambda: bool(results), timeout=2)  # no manager call in between
            assert isinstance(results[0], ArrayResponse)
            mgr.release(results[0])
            await drained(mgr, sim)


# -- item 6: a collected member that never asked does not hold the batch open ---------------
async def test_collected_silent_member_does_not_hold_the_batch_window_open(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=60) as mgr:
            asker, silent = Component("asker"), Component("silent")
            mgr.register(asker)
            mgr.register(silent)
            results: list[object] = []

            async def ask() -> None:
                results.append(await outcome(mgr, asker, block()))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await eventually(lambda: pending(mgr) > 0)
                del silent
                await eventually(lambda: bool(results), timeout=2)
            assert isinstance(results[0], ArrayResponse)
            mgr.release(results[0])
            await drained(mgr, sim)


# -- item 7: async hooks of every form run ----------------------------------------------------
async def test_async_invalidate_hook_and_async_callable_ready_hook_run(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    async with MemoryManager(sim, batch_window=0) as mgr:
        calls: list[str] = []

        async def invalidate() -> None:
            await anyio.sleep(0)
            calls.append("invalidate")

        ready, invalidate_obj = AsyncCall(), AsyncCall()
        a, b = Component("a"), Component("b")
        mgr.register(a, invalidate_hook=invalidate, ready_hook=ready)
        mgr.register(b, invalidate_hook=invalidate_obj, stream_group="other")
        response = await mgr.request(a, block())
        await eventually(lambda: ready.calls == 1)
        mgr.pool.invalidate_all()
        await eventually(lambda: calls == ["invalidate"] and invalidate_obj.calls == 1)
        mgr.release(response)
        await drained(mgr, sim)


async def test_async_invalidate_hook_outside_async_with_warns_and_is_not_left_unawaited() -> None:
    sim = SimulatorBackend(64 * MiB)
    mgr = MemoryManager(sim)
    comp = Hooked()
    mgr.register(comp, invalidate_hook=comp.on_invalidate_async)
    with pytest.warns(Warning, match="was not run"):
        mgr.pool.invalidate_all()
    other = Component()
    mgr.register(other, invalidate_hook=lambda: comp.on_invalidate_async())  # returns a coroutine
    with pytest.warns(Warning, match="was not run"):
        mgr.pool.invalidate_all()
    assert comp.invalidated == 0


# -- the adversarial suite --------------------------------------------------------------------
HOOK_KINDS = ["none", "method", "async method", "self", "function", "async object"]


def register_with_hooks(mgr: MemoryManager, rng: random.Random, comp: CallableHooked, shared: AsyncCall) -> None:
    """Register ``comp`` with a random kind of ready and invalidate hook."""
    ready: Any = {
        "none": None,
        "method": comp.on_ready,
        "async method": comp.on_ready_async,
        "self": comp,
        "function": lambda r: None,
        "async object": shared,
    }[rng.choice(HOOK_KINDS)]
    invalidate = rng.choice([None, comp.on_invalidate, comp.on_invalidate_async, shared])
    mgr.register(comp, ready_hook=ready, invalidate_hook=invalidate, stream_group=rng.choice(["g0", "g1", "g2"]))


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_members_with_hooks_come_and_go(seed: int, drained) -> None:
    """Members with every kind of hook request, are collected mid-flight and reset at random."""
    rng = random.Random(seed)
    sim = SimulatorBackend(64 * MiB, latency=rng.choice([0.0, 0.0005]))
    rounds = scale(12, 300)
    mode, policy = rng.choice([("passive", "chunk"), ("active", "wait"), ("active", "chunk")])
    with anyio.fail_after(scale(60, 900)):
        async with MemoryManager(sim, mode=mode, policy=policy, batch_window=rng.choice([0, 0.001, 0.05])) as mgr:
            keeper = Hooked()
            mgr.register(keeper, ready_hook=keeper.on_ready, stream_group="g0")
            refs: list[weakref.ref[Hooked]] = []
            shared = AsyncCall()
            for _ in range(rounds):
                comps = [CallableHooked() for _ in range(rng.randint(1, 6))]
                for comp in comps:
                    register_with_hooks(mgr, rng, comp, shared)
                    refs.append(weakref.ref(comp))

                async def ask(comp: Hooked) -> None:
                    await outcome(mgr, comp, block(rng.choice([0.1, 0.5])))  # responses dropped: held

                async with anyio.create_task_group() as tg:
                    for comp in comps:
                        if rng.random() < 0.8:
                            tg.start_soon(ask, comp)
                    await anyio.sleep(rng.choice([0, 0.001, 0.003]))
                    if rng.random() < 0.2:
                        mgr.pool.invalidate_all()
                    if rng.random() < 0.3:
                        del comps[rng.randrange(len(comps))]  # collected while its requests may be queued
                    if rng.random() < 0.3:
                        tg.cancel_scope.cancel()
                    else:
                        mgr.groups.flush()
                del comps, comp
                gc.collect()
                await anyio.sleep(0.001)

            def all_collected() -> bool:
                gc.collect()
                return all(r() is None for r in refs)

            await eventually(all_collected)  # once async hook tasks are done, no hook keeps one alive
            await eventually(lambda: sim.used == 0, timeout=scale(10, 60))  # all reaped, no manager call
            assert mgr.groups.members() == {"g0": ["Hooked#1"]}
            mgr.unregister(keeper)
            await settle(mgr)
            await drained(mgr, sim)


# -- order: resolution and ready hooks are FIFO on every loop (task wake-up order is not) ------
@pytest.mark.parametrize("seed", SEEDS)
async def test_ready_hooks_run_in_submission_order(seed: int, drained) -> None:
    rng = random.Random(seed)
    sim = SimulatorBackend(64 * MiB, latency=0.0005)
    hooked: list[int] = []
    async with MemoryManager(sim, batch_window=rng.choice([0, 0.002]), max_batch=rng.choice([None, 3])) as mgr:
        comp = Hooked()
        mgr.register(comp, ready_hook=lambda r: hooked.append(id(r)))
        submitted: list[int] = []
        responses: dict[int, ArrayResponse] = {}

        async def ask(i: int) -> None:
            await anyio.sleep(rng.choice([0, 0.001]))
            submitted.append(i)  # no checkpoint between this and the request's submission
            response = await mgr.request(comp, block(0.05))
            responses[i] = response

        async with anyio.create_task_group() as tg:
            for i in range(scale(30, 300)):
                tg.start_soon(ask, i)
        assert hooked == [id(responses[i]) for i in submitted]
        for response in responses.values():
            mgr.release(response)
        await drained(mgr, sim)
