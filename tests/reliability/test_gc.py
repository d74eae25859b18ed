"""Garbage collection: a registered instance that is collected leaves no registration and no arrays.

The manager holds instances weakly; after ``gc.collect()`` the next manager call unregisters the
collected ones, frees their arrays and lets their group's open batch go on without them.
"""

from __future__ import annotations

import gc
import weakref

import anyio
import pytest
from _reliability import Component, pending

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def arrays() -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((64, 1024), "float32", chunk_axis=1), "p": ArrayRequest((16,), "f8", unchunkable=True)}


async def test_collected_instance_with_arrays_held_frees_them(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0) as mgr:
            keeper = Component("keeper")
            mgr.register(keeper, proportion=0.2)
            kept = await mgr.request(keeper, arrays())
            doomed = Component("doomed")
            mgr.register(doomed, proportion=0.3, stream_group="other")
            await mgr.request(doomed, arrays())  # the response is dropped: the ledger holds the arrays
            mgr.allocate(doomed, {"y": ArrayRequest((1000,), "f8")})
            assert mgr.stats().instances["Component#2"].live_bytes > 0
            ref = weakref.ref(doomed)
            del doomed
            gc.collect()
            assert ref() is None

            snap = mgr.stats()  # the next manager call reaps it
            assert snap.instances["Component#2"].live_bytes == 0
            assert snap.live_bytes == sim.used == sum(a.nbytes for a in kept.arrays.values())
            assert mgr.groups.members() == {"default": ["Component#1"]}  # the emptied group is forgotten
            assert mgr.budget.manual_pool == pytest.approx(0.2)
            mgr.release(kept)
            await drained(mgr, sim)


async def test_collected_instance_does_not_hold_up_its_groups_open_batch(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        # a long window: the batch closes only when every member has asked
        async with MemoryManager(sim, batch_window=60) as mgr:
            asker, doomed = Component("asker"), Component("doomed")
            mgr.register(asker)
            mgr.register(doomed)
            results = []

            async def ask() -> None:
                async with mgr.request(asker, arrays()) as response:
                    results.append(response.chunked_shapes)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                while not pending(mgr):
                    await anyio.sleep(0.001)
                del doomed
                gc.collect()
                assert mgr.is_registered(asker)  # a manager call: reaps the collected member
            assert results == [{"x": (64, 1024), "p": (16,)}]
            assert mgr.groups.members() == {"default": ["Component#1"]}
            await drained(mgr, sim)


async def test_instance_collected_after_its_queued_request_was_withdrawn(drained) -> None:
    sim = SimulatorBackend(64 * MiB)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=60) as mgr:
            other = Component("other")
            mgr.register(other)  # never asks: requests stay queued
            doomed = Component("doomed")
            mgr.register(doomed, proportion=0.5)
            ref = weakref.ref(doomed)
            held = mgr.allocate(doomed, arrays())

            async def ask(instance: Component) -> None:
                await mgr.request(instance, arrays())

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(ask, doomed)
                while pending(mgr) < 3:
                    await anyio.sleep(0.001)
                tg.cancel_scope.cancel()  # the queued requests were what kept it alive
            del doomed, held
            gc.collect()
            assert ref() is None
            assert mgr.groups.members() == {"default": ["Component#1"]}
            assert mgr.budget.manual_pool == 0
            await drained(mgr, sim)


async def test_many_instances_come_and_go(drained) -> None:
    sim = SimulatorBackend(256 * MiB)
    with anyio.fail_after(20):
        async with MemoryManager(sim, batch_window=0.001) as mgr:
            survivors = []

            async def ask(instance: Component) -> None:
                await mgr.request(instance, arrays())  # the response is dropped, the arrays held

            for round_ in range(20):
                batch = [Component((round_, i)) for i in range(10)]
                for instance in batch:
                    mgr.register(instance, stream_group=f"g{round_ % 3}", name=f"c{instance.tag}")
                async with anyio.create_task_group() as tg:
                    for instance in batch:
                        tg.start_soon(ask, instance)
                survivors.append(batch[0])
                del batch, instance
                gc.collect()
                snap = mgr.stats()
                assert len(mgr.statistics().members) == len(survivors)
                each = snap.instances[f"c{survivors[-1].tag}"].live_bytes
                assert snap.live_bytes == sim.used == each * len(survivors) > 0
            for instance in survivors:
                mgr.unregister(instance)
            await drained(mgr, sim)
