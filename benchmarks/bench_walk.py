"""Overlapped walks (issue 12): copy-bound and balanced walks against raw copies and the serial walk.

- copy-bound: 256 MiB of float32 in and 256 MiB out through a trivial kernel, host arrays pinned
  (and pageable), against raw CuPy ``cudaMemcpyAsync`` of the same bytes in both directions at once;
- balanced: a kernel as long as one chunk's copy, the serial walk (depth 1) against depths 2 and 3 at
  the same memory budget;
- the pinned staging pool: bytes held against the most staged at once.

On the simulator the sizes are small and the engines slow (a model check); the targets are the GPU's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import anyio
import numpy as np
from bench_common import MIB, Device, Section, Settings, Table

from aiocubie import ArrayRequest, MemoryManager, walk_chunks, walk_requests

WIDTH = 1024  # float32 per run: a run is 4 KiB


class _Owner:
    """The walking component."""


async def _walk_once(
    mgr: MemoryManager, owner: object, response: Any, kit: Any, x: Any, y: Any, depth: int, kernel_s: float
) -> float:
    start = time.perf_counter()
    async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, depth=depth):
        kit.kernel(chunk.stream, chunk.device["x"], chunk.device["y"], kernel_s * chunk.length / response.chunk_length)
    return time.perf_counter() - start


async def walk_seconds(
    backend: Any, kit: Any, x: Any, y: Any, *, depth: int, budget: int, kernel_s_per_byte: float, repeats: int
) -> dict[str, float]:
    """Median seconds of ``repeats`` walks of x -> y at ``depth`` within ``budget`` device bytes."""
    runs = x.shape[0]
    total = backend.device.memory_info().total
    owner = _Owner()
    async with MemoryManager(backend, mode="active", headroom=0.0) as mgr:
        mgr.register(owner, proportion=budget / total)
        requests = walk_requests(
            {"x": ArrayRequest((runs, WIDTH), np.float32), "y": ArrayRequest((runs, WIDTH), np.float32)}, depth
        )
        async with mgr.request(owner, requests) as response:
            kernel_s = kernel_s_per_byte * response.chunk_length * WIDTH * 4
            await _walk_once(mgr, owner, response, kit, x, y, depth, kernel_s)  # warm up (pins staging)
            mgr.backend.device.pinned_pool.reset_peak()
            seconds = [await _walk_once(mgr, owner, response, kit, x, y, depth, kernel_s) for _ in range(repeats)]
            np.testing.assert_array_equal(y[:: max(1, runs // 7)], x[:: max(1, runs // 7)])
            pinned = mgr.stats().pinned
            chunks, length = response.chunks, response.chunk_length
        mgr.host.release_pinned()
    return {
        "seconds": statistics.median(seconds),
        "chunks": chunks,
        "chunk_mib": length * WIDTH * 4 / MIB,
        "pinned_held": pinned.held,
        "pinned_peak": pinned.peak_in_use,
    }


def run(device: Device, settings: Settings) -> Section:
    section = Section()
    gpu = settings.backend == "cuda"
    kit = device.walk_kit()  # type: ignore[attr-defined]
    backend = kit.backend
    mib = (256 if gpu else 8) // (4 if settings.quick else 1)
    runs = mib * MIB // (WIDTH * 4)
    repeats = settings.iters(5, 2)
    budget = mib * MIB // 2  # the walk holds 1/4 of x + y at once: chunks of 1/8 at depth 2
    x_pinned, y_pinned = kit.pinned((runs, WIDTH), np.float32), kit.pinned((runs, WIDTH), np.float32)
    x_pinned[...] = np.arange(runs * WIDTH, dtype=np.float32).reshape(runs, WIDTH) % 65521
    x_page, y_page = np.array(x_pinned), np.zeros((runs, WIDTH), np.float32)
    nbytes = x_pinned.nbytes

    try:
        raw_both = statistics.median(kit.raw_copies(x_pinned, y_pinned, True) for _ in range(repeats + 1))
        raw_in = statistics.median(kit.raw_copies(x_pinned, y_pinned, False) for _ in range(repeats + 1))
        raw_tp = 2 * nbytes / raw_both

        async def measure() -> dict[str, dict[str, float]]:
            found = {}
            for depth in (1, 2, 3):
                found[f"pinned d{depth}"] = await walk_seconds(
                    backend, kit, x_pinned, y_pinned, depth=depth, budget=budget, kernel_s_per_byte=0.0, repeats=repeats
                )
            for depth in (2, 3):
                found[f"pageable d{depth}"] = await walk_seconds(
                    backend, kit, x_page, y_page, depth=depth, budget=budget, kernel_s_per_byte=0.0, repeats=repeats
                )
            per_byte = raw_in / nbytes  # a kernel as long as the chunk's copy in
            for depth in (1, 2, 3):
                found[f"balanced d{depth}"] = await walk_seconds(
                    backend,
                    kit,
                    x_pinned,
                    y_pinned,
                    depth=depth,
                    budget=budget,
                    kernel_s_per_byte=per_byte,
                    repeats=repeats,
                )
            return found

        found = anyio.run(measure)
    finally:
        kit.close()

    table = Table(
        f"Walks of {mib} MiB in and {mib} MiB out, device budget {budget // MIB} MiB",
        ["walk", "chunks", "chunk MiB", "ms", "GB/s (in + out)", "vs raw both ways", "pinned held / peak staged"],
        note=f"raw CuPy cudaMemcpyAsync, both directions at once: {raw_both * 1e3:.2f} ms, {raw_tp / 1e9:.2f} GB/s; "
        f"one direction: {raw_in * 1e3:.2f} ms. Balanced: the kernel takes as long as its chunk's copy in.",
    )
    for name, m in found.items():
        tp = 2 * nbytes / m["seconds"]
        held = f"{m['pinned_held'] / max(m['pinned_peak'], 1):.3f}" if m["pinned_peak"] else "-"
        table.add(
            name,
            m["chunks"],
            round(m["chunk_mib"], 2),
            round(m["seconds"] * 1e3, 2),
            round(tp / 1e9, 2),
            round(tp / raw_tp, 3),
            held,
        )
    section.tables.append(table)
    best_pinned = max(("pinned d2", "pinned d3"), key=lambda k: 1 / found[k]["seconds"])
    best_page = max(("pageable d2", "pageable d3"), key=lambda k: 1 / found[k]["seconds"])
    pinned_tp = 2 * nbytes / found[best_pinned]["seconds"]
    page_tp = 2 * nbytes / found[best_page]["seconds"]
    section.target(
        f"copy-bound walk, pinned ({best_pinned}) / raw CuPy copies both ways",
        round(pinned_tp / raw_tp, 3),
        0.85,
        at_least=True,
    )
    section.target(
        f"copy-bound walk, pageable ({best_page}) / pinned", round(page_tp / pinned_tp, 3), 0.70, at_least=True
    )
    serial = found["balanced d1"]["seconds"]
    best_bal = min(("balanced d2", "balanced d3"), key=lambda k: found[k]["seconds"])
    section.target(
        f"balanced walk ({best_bal}) speed-up over the serial walk",
        round(serial / found[best_bal]["seconds"], 3),
        2.0,
        at_least=True,
    )
    held = max(found[k]["pinned_held"] / found[k]["pinned_peak"] for k in ("pageable d2", "pageable d3"))
    section.target("pinned bytes held / bytes staged at once", round(held, 3), 1.1)
    return section
