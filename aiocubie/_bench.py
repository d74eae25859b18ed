"""The scheduler's own cost, measurable from an installed wheel: ``aiocubie bench``.

Requests on a zero-latency device (its events are done when recorded), so what is measured is
aiocubie's Python: submitting, batching, planning, building responses, bookkeeping and
resolving. Each figure is the time per request of a loop that requests one 1 MiB array and
releases it, divided by a bare asyncio future round trip timed in the same run. It imports no
device library. ``benchmarks/run`` (in a checkout) runs this and the device benchmarks.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ._backends import ArrayMaker, Backend, Block, Device, Event, MemoryInfo, MemoryResource, PoolFacts
from ._errors import OutOfMemoryError
from ._manager import MemoryManager
from ._requests import ArrayRequest, MemoryKind

__all__ = ["TARGETS", "InstantBackend", "main", "measure", "report"]

#: Per-request cost targets, in x a bare asyncio future round trip.
TARGETS = {"one request in a loop": 2.5, "64 requesters, one group": 2.0, "64 requesters, 64 groups": 3.0}

REQUEST = {"a": ArrayRequest((1 << 18,), np.float32)}  # 1 MiB


class _Owner:
    """A registered component."""


class DoneEvent(Event):
    """An event the device has already reached."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        callback()


class _InstantDevice(Device):
    """A device that finishes work as it is queued."""

    name = "instant"
    granule = 0
    device_name = "zero-latency in-process device"
    default_resource = "driver"

    def __init__(self, memory: _InstantMemory) -> None:
        self.memory = memory

    def _create_resource(self, name: str) -> MemoryResource:
        return self.memory

    def memory_info(self) -> MemoryInfo:
        return MemoryInfo(self.memory.total - self.memory.used, self.memory.total)

    def synchronize(self) -> None:
        pass  # work finishes as it is queued

    def create_stream(self) -> Any:
        return object()

    def zero(self, array: Any, stream: Any) -> None:
        array.fill(0)

    def record_event(self, stream: Any) -> Event:
        return DoneEvent()

    def wait_event(self, stream: Any, event: Event) -> None:
        pass

    def is_pinned(self, array: Any) -> bool:
        return False

    def copy(self, src: Any, dst: Any, stream: Any, *, tag: object = None) -> None:
        np.copyto(dst, src)

    def copy_strided(self, src: Any, dst: Any, stream: Any, *, tag: object = None) -> None:
        np.copyto(dst, src)

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        return np.zeros(shape, dtype)

    def prefetch(self, array: Any, device: int | None, stream: Any) -> None:
        pass

    def advise(self, array: Any, advice: Any, device: int | None) -> None:
        pass

    def reset(self) -> None:
        self.memory.used = 0


class _InstantMemory(MemoryResource):
    """``total`` bytes, counted; each block's memory is numpy's, kept for reuse once given back.

    A GPU's pool hands a freed block to the next allocation; so does this resource, by size (the
    memory is host memory, not counted in ``used``). Fresh numpy memory for every block would
    measure the C allocator instead of aiocubie: freed at each release, it goes back to the
    operating system whenever the heap's top is free, and the next batch's first writes
    page-fault it back in (half the loop's time in ``bench_stream_host``'s "4 tasks, one group").
    """

    name = "driver"

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._kept: defaultdict[int, list[np.ndarray[Any, Any]]] = defaultdict(list)  # given back, by size

    def allocate(self, nbytes: int, kind: MemoryKind, stream: Any) -> Block:
        if kind is MemoryKind.DEVICE:  # the benchmark asks for device memory only
            if nbytes > self.total - self.used:
                raise OutOfMemoryError(f"out of memory: {nbytes} bytes asked, {self.total - self.used} free")
            self.used += nbytes
        kept = self._kept[nbytes]
        return Block(0, nbytes, kind, stream, kept.pop() if kept else np.empty(nbytes, np.uint8))

    def deallocate(self, block: Block) -> None:
        if block.kind is MemoryKind.DEVICE:
            self.used -= block.nbytes
        self._kept[block.nbytes].append(block.handle)  # as a pool: an array still over it sees the next one's data

    def pool_facts(self) -> PoolFacts:
        return PoolFacts(self.used, self.used, 0)  # no pool: nothing cached

    def release_cached(self) -> int:
        return 0


class _NumpyArrays(ArrayMaker):
    """Plain numpy arrays over the blocks' memory, whatever the kind: nothing to model."""

    name = "numpy"

    def make(self, block: Block, shape: tuple[int, ...], dtype: np.dtype[Any], stream: Any) -> Any:
        return np.ndarray(shape, dtype, buffer=block.handle)


class InstantBackend(Backend):
    """A device of ``total`` bytes that finishes work as it is queued; arrays are numpy's."""

    def __init__(self, total: int = 8 << 30) -> None:
        memory = _InstantMemory(total)
        super().__init__(_InstantDevice(memory), memory, _NumpyArrays())


async def per_request(body: Callable[[int], Awaitable[None]], count: int, repeats: int) -> float:
    """The best over ``repeats`` of the seconds per request of ``body(count)``.

    The best, as ``timeit`` reports: on a shared machine other work only ever adds time, so the
    fastest run is the closest to what the code costs (the baseline is measured the same way).
    """
    await body(max(1, count // 10))  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        await body(count)
        times.append((time.perf_counter() - start) / count)
    return min(times)


async def future_round_trip(count: int) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(count):
        future = loop.create_future()
        loop.call_soon(future.set_result, None)
        await future


async def measure(count: int, repeats: int) -> dict[str, float]:
    """Seconds per request of each path, and of the bare future, in this loop.

    The heap that exists before is frozen for the measurement (``gc.freeze``), so that what the caller
    imported first (the CLI imports more than ``benchmarks/run``) does not change the figures.
    """
    gc.collect()
    gc.freeze()
    try:
        return await _measure(count, repeats)
    finally:
        gc.unfreeze()


async def _measure(count: int, repeats: int) -> dict[str, float]:
    results = {"bare asyncio future round trip": await per_request(future_round_trip, count, repeats)}

    async with MemoryManager(InstantBackend()) as mgr:
        owner = _Owner()
        mgr.register(owner, stream_group="solo")

        async def single(n: int) -> None:
            for _ in range(n):
                mgr.release(await mgr.request(owner, REQUEST))

        results["one request in a loop"] = await per_request(single, count, repeats)

    # the same loop the ordinary way: a second member that never asks keeps the express path off
    async with MemoryManager(InstantBackend(), batch_window=0) as mgr:
        owner, idle = _Owner(), _Owner()
        for each in (owner, idle):
            mgr.register(each, stream_group="pair")

        async def ordinary(n: int) -> None:
            for _ in range(n):
                mgr.release(await mgr.request(owner, REQUEST))

        results["one request in a loop, not express"] = await per_request(ordinary, count, repeats)

    for label, groups in (("64 requesters, one group", False), ("64 requesters, 64 groups", True)):
        async with MemoryManager(InstantBackend()) as mgr:
            owners = [_Owner() for _ in range(64)]
            for i, owner in enumerate(owners):
                mgr.register(owner, stream_group=f"g{i}" if groups else "batch")

            async def requester(owner: _Owner, rounds: int) -> None:
                for _ in range(rounds):
                    mgr.release(await mgr.request(owner, REQUEST))

            async def everyone(n: int) -> None:
                await asyncio.gather(*(requester(owner, max(1, n // 64)) for owner in owners))

            results[label] = await per_request(everyone, count, repeats)
    return results


def report(results: dict[str, float]) -> list[tuple[str, float, float, float | None]]:
    """Rows of (path, us per request, x bare future, target) for ``measure``'s results."""
    base = results["bare asyncio future round trip"]
    return [(label, seconds * 1e6, seconds / base, TARGETS.get(label)) for label, seconds in results.items()]


def main(quick: bool = False) -> list[tuple[str, float, float, float | None]]:
    """Measure (a smoke run if ``quick``) and return :func:`report`'s rows."""
    count, repeats = (640, 3) if quick else (6400, 7)
    return report(asyncio.run(measure(count, repeats)))
