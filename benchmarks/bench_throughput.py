"""Throughput: N concurrent requesters in one stream group (batched) and in N groups.

Each requester loops ``await mgr.request`` of one 1 MiB array and releases it; requests/s and
the wall time per request are compared with the raw path, one request and N behind one event.
"""

from __future__ import annotations

import time

import anyio
from bench_common import Device, Section, Settings, Table, ratio, summary, time_sync
from bench_latency import REQUEST, Owner

from aiocubie import MemoryManager

#: Per request, 64 requesters batched, against the raw CuPy pool path's one request (GPU targets).
BATCHED_TARGET = {"cupy": 2.5, "numba": 3.0}


async def requesters(device: Device, n: int, grouped: bool, rounds: int, warmup: int, array_type: str) -> float:
    """Seconds for ``n`` requesters to make ``rounds`` requests each (after ``warmup`` rounds)."""
    async with MemoryManager(device.backend_for(array_type)) as mgr:
        owners = [Owner() for _ in range(n)]
        for i, owner in enumerate(owners):
            mgr.register(owner, stream_group="batch" if grouped else f"group{i}")

        async def loop(owner: Owner, count: int) -> None:
            for _ in range(count):
                mgr.release(await mgr.request(owner, REQUEST))

        async def all_of_them(count: int) -> None:
            async with anyio.create_task_group() as tg:
                for owner in owners:
                    tg.start_soon(loop, owner, count)

        await all_of_them(warmup)
        start = time.perf_counter()
        await all_of_them(rounds)
        return time.perf_counter() - start


def run(device: Device, settings: Settings) -> Section:
    """Requests/s for each N and layout, per allocator, on asyncio."""
    section = Section()
    table = Table(
        "Throughput: N concurrent requesters (asyncio)",
        ["allocator", "arrays", "layout", "N", "requests/s", "us per request", "x raw 1", "x raw N"],
        note=f"x raw 1: us per request over the median of one '{device.baseline}'; x raw N: over "
        "the same raw path allocating N arrays behind one event, divided by N (one group only).",
    )
    total = settings.iters(8000, 200)
    for allocator in device.allocators:
        device.use(allocator)
        make = device.raw_paths()[device.baseline]
        raw_one = summary(time_sync(make(1), settings.iters(1000), settings.iters(100, 10)))["median_us"]
        for n in settings.requesters:
            rounds = max(4, total // n)
            raw_n = summary(time_sync(make(n), max(20, rounds // 4), 3))["median_us"] / n
            for array_type in device.array_types:
                for grouped in (True, False):
                    seconds = anyio.run(requesters, device, n, grouped, rounds, 2, array_type, backend="asyncio")
                    per_request = seconds / (n * rounds) * 1e6
                    layout = "one group" if grouped else "N groups"
                    table.add(
                        allocator,
                        array_type,
                        layout,
                        n,
                        round(n * rounds / seconds),
                        round(per_request, 3),
                        ratio(per_request, raw_one),
                        ratio(per_request, raw_n) if grouped else None,
                    )
                    if device.name == "cuda" and grouped and n == 64:
                        section.target(
                            f"per request, 64 requesters batched / raw CuPy pool 1 request ({allocator}, {array_type} arrays)",
                            ratio(per_request, raw_one),
                            BATCHED_TARGET[array_type],
                            "x",
                        )
    section.tables.append(table)
    return section
