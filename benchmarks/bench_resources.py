"""The CUDA resources head to head, at the seam (no manager): what picks the default allocator.

For each resource (``driver``, ``cupy``, ``cupy_async``, ``numba`` where installed), in one process,
alternating rounds so that drift hits every resource alike:

- ``alloc``: host time of ``allocate(1 MiB) + make a CuPy array + deallocate`` (median of a round);
- ``ready``: request->ready for one 1 MiB array: allocate, array, zero on the group's stream,
  record an event, and an asyncio future resolved by the event's callback (median);
- ``stream``: a stream of 64 one-chunk batches (two 1 MiB arrays each: copy in from pinned
  memory, copy out, release), each batch's event awaited before the next (total ms).

Usage: ``python benchmarks/bench_resources.py [--rounds 7] [--json out.json]``. Needs a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from aiocubie._backends._cuda import CudaDevice, CupyArrays
from aiocubie._requests import MemoryKind

MiB = 1 << 20


def _names() -> list[str]:
    names = ["driver", "cupy", "cupy_async"]
    try:
        if importlib.util.find_spec("numba_cuda") is not None:
            names.append("numba")
    except ImportError:  # hidden (scripts/no_numba)
        pass
    return names


def alloc_round(device: Any, resource: Any, arrays: Any, stream: Any, n: int) -> float:
    dtype = np.dtype(np.float32)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        block = resource.allocate(MiB, MemoryKind.DEVICE, stream)
        array = arrays.make(block, (MiB // 4,), dtype, stream)
        resource.deallocate(block)
        del array, block
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


async def ready_round(device: Any, resource: Any, arrays: Any, stream: Any, n: int) -> float:
    loop = asyncio.get_running_loop()
    dtype = np.dtype(np.float32)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        block = resource.allocate(MiB, MemoryKind.DEVICE, stream)
        array = arrays.make(block, (MiB // 4,), dtype, stream)
        device.zero(array, stream)
        future = loop.create_future()
        device.record_event(stream).add_done_callback(lambda f=future: loop.call_soon_threadsafe(f.set_result, None))
        await future
        times.append(time.perf_counter() - t0)
        resource.deallocate(block)
        del array, block
    return statistics.median(times) * 1e6


async def stream_round(device: Any, resource: Any, arrays: Any, stream: Any, batches: int = 64) -> float:
    loop = asyncio.get_running_loop()
    dtype = np.dtype(np.float32)
    host_in = device.host_array((MiB // 4,), dtype, MemoryKind.PINNED)
    host_out = device.host_array((MiB // 4,), dtype, MemoryKind.PINNED)
    t0 = time.perf_counter()
    for _ in range(batches):
        blocks = [resource.allocate(MiB, MemoryKind.DEVICE, stream) for _ in range(2)]
        x, y = (arrays.make(b, (MiB // 4,), dtype, stream) for b in blocks)
        device.copy(host_in, x, stream)
        device.copy(x, y, stream)
        device.copy(y, host_out, stream)
        future = loop.create_future()
        device.record_event(stream).add_done_callback(lambda f=future: loop.call_soon_threadsafe(f.set_result, None))
        await future
        for block in blocks:
            resource.deallocate(block)
        del x, y, blocks
    return (time.perf_counter() - t0) * 1e3


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=400, help="iterations a round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = CudaDevice(0)
    arrays = CupyArrays(0)
    stream = device.create_stream()
    resources = {name: device.create_resource(name) for name in _names()}
    results: dict[str, dict[str, list[float]]] = {name: {"alloc": [], "ready": [], "stream": []} for name in resources}
    for resource in resources.values():  # warm every resource: pools filled, code paths compiled
        alloc_round(device, resource, arrays, stream, 50)
        asyncio.run(ready_round(device, resource, arrays, stream, 50))
    for _ in range(args.rounds):
        for name, resource in resources.items():
            results[name]["alloc"].append(alloc_round(device, resource, arrays, stream, args.n))
            results[name]["ready"].append(asyncio.run(ready_round(device, resource, arrays, stream, args.n)))
            results[name]["stream"].append(asyncio.run(stream_round(device, resource, arrays, stream)))
    summary = {
        name: {
            key: {"median": statistics.median(values), "min": min(values), "max": max(values)}
            for key, values in r.items()
        }
        for name, r in results.items()
    }
    print(f"{'resource':12s} {'alloc+array (us)':>18s} {'request->ready (us)':>20s} {'64-batch stream (ms)':>21s}")
    for name, s in summary.items():
        print(
            f"{name:12s} {s['alloc']['median']:18.2f} {s['ready']['median']:20.2f} {s['stream']['median']:21.2f}"
            f"   (ready {s['ready']['min']:.1f}-{s['ready']['max']:.1f}, stream {s['stream']['min']:.2f}-{s['stream']['max']:.2f})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": device.device_name, "rounds": args.rounds, "n": args.n, "summary": summary}, f, indent=1
            )
    device.close()
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
