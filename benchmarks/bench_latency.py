"""Request->ready latency of one warm 1 MiB device array, against raw paths and a bare future.

Times ``await mgr.request(...)`` with one registered instance (so each batch closes at once),
releasing after each iteration so the pool reuses memory; every baseline runs in this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
from bench_common import Device, Section, Settings, Table, allocate, nothing, ratio, summary, time_async, time_sync
from bench_sim import F32, SHAPE

from aiocubie import ArrayRequest, MemoryKind, MemoryManager
from aiocubie._completion import thread_safe_caller, wait_event

LOOPS = ("asyncio", "trio")
#: The manager's default batch window, and 0 (close at once).
WINDOWS = (0.002, 0.0)
REQUEST = {"a": ArrayRequest(SHAPE, F32)}
#: Single request -> ready against the raw CuPy pool path, per array type (GPU targets).
SINGLE_TARGET = {"cupy": 4.0, "numba": 5.0}


class Owner:
    """A registered component (any weak-referenceable object)."""


async def asyncio_future(n: int, warmup: int) -> np.ndarray[Any, Any]:
    """A bare asyncio future round trip: ``loop.call_soon(fut.set_result)`` then ``await fut``."""
    loop = asyncio.get_running_loop()

    async def step() -> Callable[[], None]:
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        await fut
        return nothing

    return await time_async(step, n, warmup)


async def anyio_event(n: int, warmup: int) -> np.ndarray[Any, Any]:
    """The anyio equivalent, as the bridge wakes a loop: ``anyio.Event`` set by the loop's thread-safe call."""
    call_soon = thread_safe_caller()

    async def step() -> Callable[[], None]:
        done = anyio.Event()
        call_soon(done.set)
        await done.wait()
        return nothing

    return await time_async(step, n, warmup)


async def raw_async(device: Device, n: int, warmup: int) -> np.ndarray[Any, Any]:
    """The backend without the scheduler, awaited through the completion bridge."""
    backend, stream = device.backend, device.stream

    async def step() -> Callable[[], None]:
        _, release = allocate(backend, SHAPE, F32, MemoryKind.DEVICE, stream)
        await wait_event(backend.device.record_event(stream))
        return release

    return await time_async(step, n, warmup)


async def aiocubie_request(device: Device, window: float, n: int, warmup: int, array_type: str) -> np.ndarray[Any, Any]:
    """``await mgr.request(owner, one 1 MiB array)``, released after each iteration."""
    async with MemoryManager(device.backend_for(array_type), batch_window=window) as mgr:
        owner = Owner()
        mgr.register(owner, stream_group="latency")

        async def step() -> Callable[[], None]:
            response = await mgr.request(owner, REQUEST)
            return lambda: mgr.release(response)

        return await time_async(step, n, warmup)


async def async_paths(device: Device, loop: str, n: int, warmup: int) -> dict[str, np.ndarray[Any, Any]]:
    """Every path that needs an event loop, in the current loop (``loop`` names it)."""
    samples = {}
    if loop == "asyncio":
        samples["bare asyncio future round trip"] = await asyncio_future(n, warmup)
    samples["anyio.Event set by the loop's thread-safe call"] = await anyio_event(n, warmup)
    samples["raw backend: allocate + record_event + await wait_event"] = await raw_async(device, n, warmup)
    for array_type in device.array_types:
        for window in WINDOWS:
            label = f"aiocubie await mgr.request ({array_type} arrays, batch_window={window * 1e3:g} ms)"
            samples[label] = await aiocubie_request(device, window, n, warmup, array_type)
    return samples


def run(device: Device, settings: Settings) -> Section:
    """Measure every path per allocator and loop; ratios against the device's raw baseline."""
    n, warmup = settings.iters(2000), settings.iters(200, 10)
    section = Section()
    latency = Table(
        "Request->ready latency, one 1 MiB device array (warm)",
        ["allocator", "loop", "path", "median us", "p99 us", "x raw median", "x raw p99"],
        note=f"x raw: against '{device.baseline}', measured in the same run ({n} iterations each).",
    )
    overhead = Table(
        "Scheduler overhead per request",
        [
            "allocator, arrays",
            "loop",
            "future round trip us",
            "raw backend async us",
            "aiocubie us",
            "overhead us",
            "x future",
        ],
        note="overhead = aiocubie median - raw backend async median: what the scheduler adds over the "
        "backend and the bridge. x future: aiocubie median over the loop's bare round trip.",
    )
    for allocator in device.allocators:
        device.use(allocator)
        raw = {label: summary(time_sync(make(1), n, warmup)) for label, make in device.raw_paths().items()}
        base = raw[device.baseline]
        for label, stats in raw.items():
            latency.add(
                allocator,
                "-",
                label,
                stats["median_us"],
                stats["p99_us"],
                ratio(stats["median_us"], base["median_us"]),
                ratio(stats["p99_us"], base["p99_us"]),
            )
        for loop in LOOPS:
            measured = {k: summary(v) for k, v in anyio.run(async_paths, device, loop, n, warmup, backend=loop).items()}
            for label, stats in measured.items():
                latency.add(
                    allocator,
                    loop,
                    label,
                    stats["median_us"],
                    stats["p99_us"],
                    ratio(stats["median_us"], base["median_us"]),
                    ratio(stats["p99_us"], base["p99_us"]),
                )
            future = (
                measured.get("bare asyncio future round trip")
                or measured["anyio.Event set by the loop's thread-safe call"]
            )
            raw_bridge = measured["raw backend: allocate + record_event + await wait_event"]["median_us"]
            for array_type in device.array_types:
                ours = measured[f"aiocubie await mgr.request ({array_type} arrays, batch_window=2 ms)"]["median_us"]
                overhead.add(
                    f"{allocator}, {array_type}",
                    loop,
                    future["median_us"],
                    raw_bridge,
                    ours,
                    round(ours - raw_bridge, 3),
                    ratio(ours, future["median_us"]),
                )
                if device.name == "cuda" and loop == "asyncio":
                    section.target(
                        f"median request->ready / raw CuPy pool, 1 request ({allocator}, {array_type} arrays)",
                        ratio(ours, base["median_us"]),
                        SINGLE_TARGET[array_type],
                        "x",
                    )
    section.tables += [latency, overhead]
    return section
