"""The ``rmm`` allocator against ``cupy`` and ``driver`` (request->ready), and what a hard cap inside the allocator costs.

GPU only (skips with a message elsewhere). Part 1: ``await mgr.request`` of one warm 1 MiB device
array, released after each, per allocator, in interleaved rounds (median of per-round medians);
target rmm <= 1.5x cupy, same run. Part 2: one 1 MiB allocate + free, raw: RMM's stack as aiocubie
installs it against the same stack under a ``LimitingResourceAdaptor``; the device's default pool
(cuda.core) against a pool of its own with ``max_size``. Prints a markdown report.
Run: python3 benchmarks/bench_rmm.py [rounds]
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

from aiocubie import ArrayRequest, MemoryManager, gpu_status

MiB = 1 << 20
REQUEST = {"a": ArrayRequest((MiB // 4,), np.float32)}
ALLOCATORS = ("cupy", "rmm", "driver")


class Owner:
    """A registered component."""


async def request_ready(allocator: str, n: int) -> float:
    """Median seconds of ``await mgr.request`` (batch window 0) with ``allocator``, after a warm-up."""
    mgr, owner = MemoryManager("cuda", allocator=allocator, batch_window=0.0), Owner()
    mgr.register(owner)
    times = []
    async with mgr:
        for i in range(n + 50):
            start = time.perf_counter()
            response = await mgr.request(owner, REQUEST)
            if i >= 50:
                times.append(time.perf_counter() - start)
            mgr.release(response)
    return statistics.median(times)


def per_call(step: Callable[[], Any], n: int = 3000) -> float:
    """Median seconds of ``step()`` over ``n`` calls (in batches of 100), after a warm-up."""
    for _ in range(200):
        step()
    samples = []
    for _ in range(n // 100):
        start = time.perf_counter()
        for _ in range(100):
            step()
        samples.append((time.perf_counter() - start) / 100)
    return statistics.median(samples)


def hard_cap_costs() -> list[tuple[str, float, float]]:
    """(what, seconds uncapped, seconds capped) for one 1 MiB allocate + free."""
    import rmm
    from cuda.core import Device, DeviceMemoryResource, DeviceMemoryResourceOptions

    from aiocubie._backends._cuda import CudaDevice

    device = CudaDevice(0)
    resource = device.create_resource("rmm")  # installs aiocubie's stack over the device's RMM resource
    stack = rmm.mr.get_current_device_resource()
    limited = rmm.mr.LimitingResourceAdaptor(stack, 1 << 30)
    stream = rmm.pylibrmm.stream.Stream(device.create_stream())
    rows = [
        (
            "rmm.DeviceBuffer 1 MiB, aiocubie's stack (statistics + failure callback)",
            per_call(lambda: rmm.DeviceBuffer(size=MiB, stream=stream, mr=stack)),
            per_call(lambda: rmm.DeviceBuffer(size=MiB, stream=stream, mr=limited)),
        )
    ]
    capped = __import__("aiocubie").mr.LimitingAdaptor(resource, 1 << 30)  # counts what is given back: deallocate
    kind = __import__("aiocubie").MemoryKind.DEVICE
    cuda_stream = device.create_stream()
    rows.append(
        (
            "aiocubie rmm resource allocate + deallocate 1 MiB, vs under a LimitingAdaptor",
            per_call(lambda: resource.deallocate(resource.allocate(MiB, kind, cuda_stream))),
            per_call(lambda: capped.deallocate(capped.allocate(MiB, kind, cuda_stream))),
        )
    )
    Device(0).set_current()
    default = DeviceMemoryResource(0)
    own = DeviceMemoryResource(0, DeviceMemoryResourceOptions(max_size=1 << 30))
    core_stream = device.create_stream()
    rows.append(
        (
            "cuda.core pool 1 MiB allocate + close: default pool vs own pool with max_size",
            per_call(lambda: default.allocate(MiB, stream=core_stream).close(core_stream)),
            per_call(lambda: own.allocate(MiB, stream=core_stream).close(core_stream)),
        )
    )
    try:  # the cap holds: 2 GiB through a 1 GiB limit is refused
        rmm.DeviceBuffer(size=2 << 30, stream=stream, mr=limited)
        refused = False
    except MemoryError:
        refused = True
    rows.append(("(LimitingResourceAdaptor refused 2 GiB over a 1 GiB cap)", float(refused), float(refused)))
    return rows


def main() -> None:
    usable, why = gpu_status()
    if not usable or importlib.util.find_spec("rmm") is None:
        print(f"bench_rmm needs a GPU and RMM ({why}; rmm installed: {importlib.util.find_spec('rmm') is not None})")
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    results: dict[str, list[float]] = {name: [] for name in ALLOCATORS}
    for _ in range(rounds):
        for name in ALLOCATORS:
            results[name].append(anyio.run(request_ready, name, 1000))
    median = {name: statistics.median(values) for name, values in results.items()}
    print(f"## request->ready, one warm 1 MiB device array ({rounds} interleaved rounds of 1000, median)\n")
    print("| allocator | request->ready | vs cupy |\n|---|---|---|")
    for name in ALLOCATORS:
        print(f"| {name} | {median[name] * 1e6:.1f} us | {median[name] / median['cupy']:.2f}x |")
    print(f"\nrmm / cupy = {median['rmm'] / median['cupy']:.2f} (target <= 1.5)\n")
    print("## a hard cap inside the allocator: one allocation + free\n")
    print("| path | uncapped | capped | cost of the cap |\n|---|---|---|---|")
    for what, plain, capped in hard_cap_costs():
        if what.startswith("("):
            print(f"| {what} | {bool(plain)} | | |")
        else:
            print(f"| {what} | {plain * 1e6:.2f} us | {capped * 1e6:.2f} us | {(capped - plain) * 1e6:+.2f} us |")


if __name__ == "__main__":
    main()
