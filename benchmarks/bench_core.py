"""The scheduler's own cost: requests on a zero-latency device, against a bare asyncio future.

The device here completes everything as it is queued (its events are done when recorded), so
what is measured is aiocubie's Python: submitting, batching, planning, building responses,
bookkeeping and resolving. Each figure is the time per request of a loop that requests one
1 MiB array and releases it, divided by a bare asyncio future round trip
(``loop.call_soon(fut.set_result)``; ``await fut``) timed in the same run. It runs the same on
every machine (``--backend`` does not change it): no device library is imported.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from bench_common import Section, Settings, Table, ratio
from bench_latency import REQUEST, Owner

from aiocubie import AllocationError, MemoryKind, MemoryManager
from aiocubie._backends import Backend, Event, MemoryInfo

#: Targets of the core redesign (issue: "a scheduler near the floor"), in x a bare future.
TARGETS = {"one request in a loop": 2.5, "64 requesters, one group": 2.0, "64 requesters, 64 groups": 3.0}


class DoneEvent(Event):
    """An event the device has already reached."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        callback()


class InstantBackend(Backend):
    """A device of ``total`` bytes that finishes work as it is queued; arrays are numpy's."""

    name = "instant"
    allocator = "default"
    granule = 0
    device_name = "zero-latency in-process device"

    def __init__(self, total: int = 8 << 30) -> None:
        self.total = total
        self.used = 0

    def memory_info(self) -> MemoryInfo:
        return MemoryInfo(self.total - self.used, self.total)

    def create_stream(self) -> Any:
        return object()

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind, stream: Any) -> Any:
        array = np.empty(shape, dtype)
        if kind.uses_vram:
            if array.nbytes > self.total - self.used:
                raise AllocationError(f"out of memory: {array.nbytes} bytes asked, {self.total - self.used} free")
            self.used += array.nbytes
        return array

    def zero(self, array: Any, stream: Any) -> None:
        array.fill(0)

    def free(self, array: Any) -> None:
        self.used -= array.nbytes  # the benchmark frees device arrays only

    def nbytes(self, array: Any) -> int:
        return int(array.nbytes)

    def record_event(self, stream: Any) -> Event:
        return DoneEvent()

    def copy(self, src: Any, dst: Any, stream: Any, *, tag: object = None) -> None:
        np.copyto(dst, src)

    def wait_event(self, stream: Any, event: Event) -> None:
        pass

    def is_pinned(self, array: Any) -> bool:
        return False

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        return np.zeros(shape, dtype)

    def prefetch(self, array: Any, device: int | None, stream: Any) -> None:
        pass

    def advise(self, array: Any, advice: Any, device: int | None) -> None:
        pass

    def set_allocator(self, name: str) -> None:
        pass

    def reset(self) -> None:
        self.used = 0


async def per_request(body: Callable[[int], Awaitable[None]], count: int, repeats: int) -> float:
    """Median over ``repeats`` of the seconds per request of ``body(count)``."""
    await body(max(1, count // 10))  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        await body(count)
        times.append((time.perf_counter() - start) / count)
    return statistics.median(times)


async def future_round_trip(count: int) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(count):
        future = loop.create_future()
        loop.call_soon(future.set_result, None)
        await future


async def measure(count: int, repeats: int) -> dict[str, float]:
    """Seconds per request of each path, and of the bare future, in this loop."""
    results = {"bare asyncio future round trip": await per_request(future_round_trip, count, repeats)}

    async with MemoryManager(InstantBackend()) as mgr:
        owner = Owner()
        mgr.register(owner, stream_group="solo")

        async def single(n: int) -> None:
            for _ in range(n):
                mgr.release(await mgr.request(owner, REQUEST))

        results["one request in a loop"] = await per_request(single, count, repeats)

    for label, groups in (("64 requesters, one group", False), ("64 requesters, 64 groups", True)):
        async with MemoryManager(InstantBackend()) as mgr:
            owners = [Owner() for _ in range(64)]
            for i, owner in enumerate(owners):
                mgr.register(owner, stream_group=f"g{i}" if groups else "batch")

            async def requester(owner: Owner, rounds: int) -> None:
                for _ in range(rounds):
                    mgr.release(await mgr.request(owner, REQUEST))

            async def everyone(n: int) -> None:
                async with asyncio.TaskGroup() as tg:
                    for owner in owners:
                        tg.create_task(requester(owner, max(1, n // 64)))

            results[label] = await per_request(everyone, count, repeats)
    return results


def run(device: Any, settings: Settings) -> Section:
    """Time per request of each path, as a ratio to the bare future round trip."""
    count, repeats = settings.iters(6400, 640), settings.iters(7, 3)
    results = asyncio.run(measure(count, repeats))
    base = results["bare asyncio future round trip"]
    section = Section()
    table = Table(
        "Scheduler cost per request on a zero-latency device (asyncio)",
        ["path", "us per request", "x bare future"],
        note=f"A loop of request + release of one 1 MiB array; median of {repeats} runs of {count} requests. "
        "The device completes work as it is queued: every microsecond is aiocubie's Python.",
    )
    for label, seconds in results.items():
        table.add(label, round(seconds * 1e6, 3), ratio(seconds, base))
        if label in TARGETS:
            section.target(f"per request, {label} / bare future", ratio(seconds, base), TARGETS[label], "x")
    section.tables.append(table)
    return section


if __name__ == "__main__":
    numbers = asyncio.run(measure(6400, 5))
    floor = numbers["bare asyncio future round trip"]
    for name, value in numbers.items():
        print(f"{name:40s} {value * 1e6:8.2f} us  {value / floor:5.2f}x")

