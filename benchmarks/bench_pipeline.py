#!/usr/bin/env python3
"""Real jobs (issue 21): chunked walks of every layout and a stream of small batches, through aiocubie and
written by hand with CuPy streams, in one run, every output element checked.

The job: Y = 2 X + 1 elementwise on float32 host arrays, through a kernel that first spins (a chain of
multiply-adds by runtime ones and zeros) about as long as one chunk's copy in, within a device budget of a
quarter of the data.

- layouts: the run axis first, last and in the middle, 2-D and 3-D, pinned host arrays, aiocubie at depth 2
  against two CuPy streams and two buffer sets (2-D copies, ``cudaMemcpy2DAsync``, for strided chunks);
- pageable: pageable numpy arrays, aiocubie against CuPy's copies from pageable memory, and against
  aiocubie's own pinned walk;
- stream: 64 batches of 1 MiB, each fitting the budget, request -> walk -> release; one at a time against a
  hand-written loop that synchronizes after each batch, and four tasks at once (one group; a group each)
  against one that queues everything with an event per batch. Host CPU time per batch is reported too. One
  at a time and four tasks in one group also run a hand-written asyncio loop that takes its buffers from a
  CuPy pool every batch and polls its event (what a request per batch costs at the least: the floor).

Usage: python benchmarks/bench_pipeline.py [--backend simulator|cuda] [--quick] [--name NAME] [--out DIR]
       [--only layouts|pageable|stream] [--profile]
On the simulator only aiocubie's side runs (a correctness and model check); the ratios are the GPU's.
``--profile`` adds a cProfile of the one-at-a-time batch stream: the share of host time spent making the
device current, and the top functions.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import Table, machine  # noqa: E402

from aiocubie import (  # noqa: E402
    ArrayRequest,
    MemoryManager,
    current_cupy_stream,
    walk_batches,
    walk_chunks,
    walk_requests,
)

MIB = 1 << 20

#: name -> (shape in units of "runs" and fixed sizes, run axis); the 256 MiB GPU shapes, scaled down elsewhere
LAYOUTS: dict[str, tuple[Callable[[int], tuple[int, ...]], int]] = {
    "first, 2-D": (lambda n: (n // 1024, 1024), 0),
    "last, 2-D": (lambda n: (1024, n // 1024), 1),
    "first, 3-D": (lambda n: (n // 4096, 64, 64), 0),
    "middle, 3-D": (lambda n: (64, n // 4096, 64), 1),
    "last, 3-D": (lambda n: (64, 64, n // 4096), 2),
}


class _Owner:
    """A component that walks."""


def _values(shape: tuple[int, ...], out: np.ndarray[Any, Any]) -> None:
    out.reshape(-1)[:] = np.arange(out.size, dtype=np.float32) % 65521  # 2x + 1 stays exact in float32


def _check(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], what: str) -> None:
    if not np.array_equal(y, x * np.float32(2) + np.float32(1)):
        bad = int(np.count_nonzero(y != x * np.float32(2) + np.float32(1)))
        raise AssertionError(f"{what}: {bad} of {y.size} output elements are wrong")


# -- the two kits: how to make host arrays and launch the kernel -----------------------------------------


class SimKit:
    """The simulator: aiocubie's side only; the kernel is CuPy-model arithmetic ordered on the stream."""

    name = "simulator"
    scale = 32  # data 8 MiB instead of 256

    def manager(self, budget: int, **options: Any) -> MemoryManager:
        from aiocubie.simulator import SimulatorBackend

        return MemoryManager(SimulatorBackend(1 << 30), mode="active", headroom=0.0, **options)

    def pinned(self, mgr: MemoryManager, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        return mgr.host.array(shape, np.float32, kind="pinned")

    def kernel(self, stream: Any, x: Any, y: Any) -> None:
        y[...] = x * 2 + 1

    def calibrate(self, chunk_bytes: int) -> None:
        pass


class CudaKit:
    """The GPU: CuPy, an elementwise kernel of a chosen length, and the hand-written versions."""

    name = "cuda"
    scale = 1

    def __init__(self) -> None:
        import cupy
        import cupyx

        self.cp, self.cpx = cupy, cupyx
        self.spins = 256
        self.burn = cupy.ElementwiseKernel(
            "float32 x, int32 n, float32 one, float32 zero",
            "float32 y",
            "float v = x; for (int i = 0; i < n; ++i) { v = v * one + zero; } y = 2.0f * v + 1.0f;",
            "aiocubie_bench_burn",
        )

    def manager(self, budget: int, **options: Any) -> MemoryManager:
        return MemoryManager("cuda", mode="active", headroom=0.0, **options)

    def pinned(self, mgr: MemoryManager | None, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        return self.cpx.empty_pinned(shape, np.float32)

    def _launch(self, x: Any, y: Any) -> None:
        self.burn(x, np.int32(self.spins), np.float32(1), np.float32(0), y)

    def kernel(self, stream: Any, x: Any, y: Any) -> None:
        with current_cupy_stream(stream):
            self._launch(x, y)

    def calibrate(self, chunk_bytes: int) -> None:
        """Spins so that the kernel over one chunk takes about as long as the chunk's copy in."""
        cp = self.cp
        n = chunk_bytes // 4
        host = self.cpx.empty_pinned((n,), np.float32)
        dx, dy = cp.empty(n, np.float32), cp.empty(n, np.float32)
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            copy_s = _event_seconds(cp, stream, lambda: dx.set(host, stream))
            self.spins = 256
            kernel_s = _event_seconds(cp, stream, lambda: self._launch(dx, dy))
        self.spins = max(1, round(256 * copy_s / kernel_s))

    # -- hand-written ------------------------------------------------------------------------------------
    def copy_2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind: int, s: Any) -> None:
        self.cp.cuda.runtime.memcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, s.ptr)

    def hand_chunked(self, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], axis: int, length: int) -> float:
        """Two streams, two buffer sets, 2-D copies straight between pinned host memory and the buffers."""
        cp = self.cp
        runs = x.shape[axis]
        outer = math.prod(x.shape[:axis])
        inner = math.prod(x.shape[axis + 1 :]) * 4
        shape = (*x.shape[:axis], length, *x.shape[axis + 1 :])
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        bufs = [(cp.empty(shape, np.float32), cp.empty(shape, np.float32)) for _ in range(2)]
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        for c, first in enumerate(range(0, runs, length)):
            n = min(length, runs - first)
            s, (dx, dy) = streams[c % 2], bufs[c % 2]
            self.copy_2d(
                dx.data.ptr, length * inner, x.ctypes.data + first * inner, runs * inner, n * inner, outer, 1, s
            )
            with s:
                index = (slice(None),) * axis + (slice(0, n),)
                self._launch(dx[index], dy[index])
            self.copy_2d(
                y.ctypes.data + first * inner, runs * inner, dy.data.ptr, length * inner, n * inner, outer, 2, s
            )
        for s in streams:
            s.synchronize()
        return time.perf_counter() - start

    def hand_pageable(self, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], length: int) -> float:
        """Run axis first, pageable host arrays: two streams, CuPy's ``set``/``get`` from pageable memory."""
        cp = self.cp
        runs = x.shape[0]
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        bufs = [
            (cp.empty((length, *x.shape[1:]), np.float32), cp.empty((length, *x.shape[1:]), np.float32))
            for _ in range(2)
        ]
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        for c, first in enumerate(range(0, runs, length)):
            n = min(length, runs - first)
            s, (dx, dy) = streams[c % 2], bufs[c % 2]
            dx[:n].set(x[first : first + n], s)
            with s:
                self._launch(dx[:n], dy[:n])
            dy[:n].get(s, out=y[first : first + n])
        for s in streams:
            s.synchronize()
        return time.perf_counter() - start

    def hand_stream(self, xs: list[Any], ys: list[Any], *, queued: bool) -> float:
        """One stream, buffers reused; synchronize after each batch, or queue all with an event per batch."""
        cp = self.cp
        s = cp.cuda.Stream(non_blocking=True)
        dx, dy = cp.empty(xs[0].shape, np.float32), cp.empty(xs[0].shape, np.float32)
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        events = []
        for x, y in zip(xs, ys):
            cp.cuda.runtime.memcpyAsync(dx.data.ptr, x.ctypes.data, x.nbytes, 1, s.ptr)
            with s:
                self._launch(dx, dy)
            cp.cuda.runtime.memcpyAsync(y.ctypes.data, dy.data.ptr, y.nbytes, 2, s.ptr)
            if queued:
                events.append(s.record())
            else:
                s.synchronize()
        s.synchronize()
        return time.perf_counter() - start

    async def hand_async_stream(self, xs: list[Any], ys: list[Any], tasks: int) -> float:
        """The floor of a request per batch: ``tasks`` asyncio tasks, each taking two blocks of a CuPy pool
        per batch, queuing copy in, kernel and copy out on one stream, and awaiting the batch's event by
        polling it between loop iterations (as aiocubie's poller does); the blocks go back after."""
        cp = self.cp
        pool, s = cp.cuda.MemoryPool(), cp.cuda.Stream(non_blocking=True)
        shape, nbytes = xs[0].shape, xs[0].nbytes

        async def worker(i: int) -> None:
            for b in range(i, len(xs), tasks):
                dx = cp.ndarray(shape, np.float32, pool.malloc(nbytes))
                dy = cp.ndarray(shape, np.float32, pool.malloc(nbytes))
                cp.cuda.runtime.memcpyAsync(dx.data.ptr, xs[b].ctypes.data, nbytes, 1, s.ptr)
                with s:
                    self._launch(dx, dy)
                cp.cuda.runtime.memcpyAsync(ys[b].ctypes.data, dy.data.ptr, nbytes, 2, s.ptr)
                event = s.record()
                while not event.done:
                    await anyio.lowlevel.checkpoint()
                del dx, dy

        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(tasks):
                tg.start_soon(worker, i)
        s.synchronize()
        seconds = time.perf_counter() - start
        pool.free_all_blocks()
        return seconds


def _event_seconds(cp: Any, stream: Any, work: Callable[[], None], repeats: int = 5) -> float:
    work()
    times = []
    for _ in range(repeats):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        work()
        b.record(stream)
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return statistics.median(times)


# -- aiocubie's side --------------------------------------------------------------------------------------


async def aio_chunked(
    mgr: MemoryManager, kit: Any, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any], axis: int, budget: int, depth: int
) -> tuple[float, int, int]:
    """Seconds for one walk of x -> y (request, walk, release), its chunk count and chunk length."""
    owner = _Owner()
    mgr.register(owner, proportion=budget / mgr.pool.memory_info().total)
    requests = walk_requests(
        {"x": ArrayRequest.like(x, chunk_axis=axis), "y": ArrayRequest.like(y, chunk_axis=axis)}, depth
    )
    try:
        start = time.perf_counter()
        async with mgr.request(owner, requests) as response:
            async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, depth=depth):
                kit.kernel(chunk.stream, chunk.device["x"], chunk.device["y"])
            chunks, length = response.chunks, response.chunk_length
        return time.perf_counter() - start, chunks, length
    finally:
        mgr.unregister(owner)


async def aio_stream(
    mgr: MemoryManager,
    kit: Any,
    xs: list[Any],
    ys: list[Any],
    budget: int,
    tasks: int,
    groups: int,
    *,
    depth: int = 2,
    ordered: bool = True,
    keep: bool = False,
    in_flight: int | None = None,
) -> float:
    """Seconds for ``len(xs)`` batches, ``tasks`` tasks each walking its share one batch at a time.

    The loader docs/concepts/walks.md shows: requests built once; each batch requested ``ordered`` (ready
    once allocated, in stream order) and walked overlapped at ``depth`` 2, so the host waits
    only for its outputs (``depth=1, ordered=False``: the serial walk of a request awaited on
    its event). ``keep``: each task requests once and walks every batch through the same buffers.
    ``in_flight``: each task requests once and walks its batches with ``walk_batches`` (that many
    queued and not landed at most).
    """
    owners = [_Owner() for _ in range(tasks)]
    total = mgr.pool.memory_info().total
    for i, owner in enumerate(owners):
        mgr.register(owner, proportion=budget / total / tasks, stream_group=f"g{i % groups}")
    requests = walk_requests(
        {"x": ArrayRequest.like(xs[0], chunk_axis=0), "y": ArrayRequest.like(ys[0], chunk_axis=0)}, depth
    )

    async def walk(response: Any, b: int) -> None:
        async for chunk in walk_chunks(
            response, inputs={"x": xs[b]}, outputs={"y": ys[b]}, depth=depth, overlap=depth > 1
        ):
            kit.kernel(chunk.stream, chunk.device["x"], chunk.device["y"])

    async def worker(i: int) -> None:
        owner = owners[i]
        if in_flight is not None:
            async with mgr.request(owner, requests, ordered=ordered) as response:
                pairs = (({"x": xs[b]}, {"y": ys[b]}) for b in range(i, len(xs), tasks))
                async for chunk in walk_batches(response, pairs, in_flight=in_flight):
                    kit.kernel(chunk.stream, chunk.device["x"], chunk.device["y"])
            return
        if keep:
            async with mgr.request(owner, requests, ordered=ordered) as response:
                for b in range(i, len(xs), tasks):
                    await walk(response, b)
            return
        for b in range(i, len(xs), tasks):
            async with mgr.request(owner, requests, ordered=ordered) as response:
                await walk(response, b)

    try:
        start = time.perf_counter()
        if tasks == 1:  # one loader: awaited where it runs, as a program with one loader would
            await worker(0)
        else:
            async with anyio.create_task_group() as tg:
                for i in range(tasks):
                    tg.start_soon(worker, i)
        return time.perf_counter() - start
    finally:
        for owner in owners:
            mgr.unregister(owner)


# -- the runs ---------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _ratio(value: float, base: float | None) -> str:
    return "n/a" if base is None else f"{value / base:.2f}x"


async def run_layouts(
    kit: Any, mgr: MemoryManager, data: int, repeats: int, table: Table, rows: list[dict[str, Any]]
) -> None:
    budget = data // 4
    gpu = kit.name == "cuda"
    for name, (shape_of, axis) in LAYOUTS.items():
        shape = shape_of(data // 4)
        x, y = kit.pinned(mgr, shape), kit.pinned(mgr, shape)
        _values(shape, x)
        aio, hand = [], []
        length = 0
        for _ in range(repeats + 1):  # the first of each is a warm-up
            y.fill(np.nan)
            seconds, chunks, length = await aio_chunked(mgr, kit, x, y, axis, budget, depth=2)
            _check(x, y, f"aiocubie {name}")
            aio.append(seconds)
            if gpu:
                if not hand:
                    kit.calibrate(length * x.nbytes // x.shape[axis])
                y.fill(np.nan)
                hand.append(kit.hand_chunked(x, y, axis, length))
                _check(x, y, f"hand-written {name}")
        a, h = _median(aio[1:]), (_median(hand[1:]) if hand else None)
        table.add(f"pinned, run axis {name}", "x".join(map(str, shape)), chunks, h and h * 1e3, a * 1e3, _ratio(a, h))
        rows.append({"job": f"pinned {name}", "shape": shape, "chunks": chunks, "hand_s": h, "aiocubie_s": a})


async def run_pageable(
    kit: Any, mgr: MemoryManager, data: int, repeats: int, table: Table, rows: list[dict[str, Any]]
) -> None:
    budget = data // 4
    gpu = kit.name == "cuda"
    shape_of, axis = LAYOUTS["first, 2-D"]
    shape = shape_of(data // 4)
    x, y = np.empty(shape, np.float32), np.empty(shape, np.float32)
    xp, yp = kit.pinned(mgr, shape), kit.pinned(mgr, shape)
    _values(shape, x)
    xp[...] = x
    aio, pinned, hand = [], [], []
    for _ in range(repeats + 1):
        y.fill(np.nan)
        seconds, chunks, length = await aio_chunked(mgr, kit, x, y, axis, budget, depth=2)
        _check(x, y, "aiocubie pageable")
        aio.append(seconds)
        yp.fill(np.nan)
        pinned.append((await aio_chunked(mgr, kit, xp, yp, axis, budget, depth=2))[0])
        _check(xp, yp, "aiocubie pinned")
        if gpu:
            y.fill(np.nan)
            hand.append(kit.hand_pageable(x, y, length))
            _check(x, y, "hand-written pageable")
    a, p, h = _median(aio[1:]), _median(pinned[1:]), (_median(hand[1:]) if hand else None)
    table.add("pageable, run axis first, 2-D", "x".join(map(str, shape)), chunks, h and h * 1e3, a * 1e3, _ratio(a, h))
    table.add("  (aiocubie's pinned walk of the same)", "", chunks, None, p * 1e3, f"pageable/pinned {a / p:.2f}x")
    # strided pageable data (the run axis last): packed by host threads into contiguous staging
    shape_of, axis = LAYOUTS["last, 2-D"]
    shape = shape_of(data // 4)
    xs, ys = x.reshape(shape), y.reshape(shape)
    strided = []
    for _ in range(repeats + 1):
        ys.fill(np.nan)
        strided.append((await aio_chunked(mgr, kit, xs, ys, axis, budget, depth=2))[0])
        _check(xs, ys, "aiocubie pageable strided")
    s = _median(strided[1:])
    table.add(
        "pageable, run axis last, 2-D", "x".join(map(str, shape)), chunks, None, s * 1e3, f"/pinned first {s / p:.2f}x"
    )
    rows.append({"job": "pageable last, 2-D", "hand_s": None, "aiocubie_s": s})
    one, threaded = _host_bandwidth(x[:length], xp[:length], repeats)
    table.add(
        "  (host copy of one chunk, pageable to pinned: the staging threads' limit)",
        f"{x[:length].nbytes / MIB:.1f} MiB",
        1,
        None,
        None,
        f"1 thread {one:.1f} GB/s, threaded {threaded:.1f} GB/s",
    )
    rows.append(
        {
            "job": "host copy of one chunk",
            "hand_s": None,
            "aiocubie_s": x[:length].nbytes / threaded / 1e9,
            "one_thread_gbs": one,
            "threaded_gbs": threaded,
        }
    )
    rows.append({"job": "pageable first, 2-D", "chunks": chunks, "hand_s": h, "aiocubie_s": a, "aiocubie_pinned_s": p})


def _host_bandwidth(src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any], repeats: int) -> tuple[float, float]:
    """GB/s of copying ``src`` into ``dst`` on the host: one thread (numpy), and aiocubie's staging copy."""
    from aiocubie._backends._staging import host_copy

    rates = []
    for copy in (np.copyto, host_copy):
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            copy(dst, src)
            times.append(time.perf_counter() - start)
        rates.append(src.nbytes / _median(times[1:]) / 1e9)
    return rates[0], rates[1]


#: The stream rows that also run the hand-written asyncio loop allocating per batch (the request path's floor).
FLOORS = ("one at a time", "4 tasks, one group")


async def run_stream(
    kit: Any, mgr: MemoryManager, batch: int, batches: int, repeats: int, table: Table, rows: list[dict[str, Any]]
) -> None:
    gpu = kit.name == "cuda"
    shape = (batch // 4096, 1024)
    xs = [kit.pinned(mgr, shape) for _ in range(batches)]
    ys = [kit.pinned(mgr, shape) for _ in range(batches)]
    for x in xs:
        _values(shape, x)
        x += np.float32(len(xs))  # batches differ
    budget = 4 * batch * 4  # each batch (x and y) fits, four at once too
    if gpu:
        kit.calibrate(batch)
    # label, tasks, groups, hand-written baseline queued, aiocubie's loader (see aio_stream), batch window
    serial = {"depth": 1, "ordered": False}
    cases: list[tuple[str, int, int, bool, dict[str, Any], float | None]] = [
        ("one at a time", 1, 1, False, {}, None),
        ("one at a time, serial walk of an awaited request", 1, 1, False, serial, None),
        ("4 tasks, one group", 4, 1, True, {}, None),
        ("4 tasks, one group, batch_window=0", 4, 1, True, {}, 0.0),
        ("4 tasks, a group each", 4, 4, True, {}, None),
        ("4 tasks, a group each, serial walks of awaited requests", 4, 4, True, serial, None),
        ("one at a time, one response kept (its buffers reused)", 1, 1, False, {"keep": True}, None),
        ("one at a time, walk_batches (in_flight=1)", 1, 1, False, {"in_flight": 1}, None),
        ("4 in flight, one task, walk_batches (in_flight=4)", 1, 1, True, {"in_flight": 4}, None),
        ("4 tasks, one group, a response kept each", 4, 1, True, {"keep": True}, None),
        ("4 tasks, a group each, a response kept each", 4, 4, True, {"keep": True}, None),
    ]
    for label, tasks, groups, queued, loader, window in cases:
        aio, cpu, hand, floor = [], [], [], []
        manager = kit.manager(budget, batch_window=window) if window is not None else None
        if manager is not None:
            await manager.__aenter__()
        for _ in range(repeats + 1):
            for y in ys:
                y.fill(np.nan)
            cpu0 = time.process_time()
            aio.append(await aio_stream(manager or mgr, kit, xs, ys, budget, tasks, groups, **loader))
            cpu.append(time.process_time() - cpu0)
            for x, y in zip(xs, ys):
                _check(x, y, f"aiocubie stream {label}")
            if gpu:
                for y in ys:
                    y.fill(np.nan)
                hand.append(kit.hand_stream(xs, ys, queued=queued))
                for x, y in zip(xs, ys):
                    _check(x, y, f"hand-written stream {label}")
                if label in FLOORS:
                    for y in ys:
                        y.fill(np.nan)
                    floor.append(await kit.hand_async_stream(xs, ys, tasks))
                    for x, y in zip(xs, ys):
                        _check(x, y, f"hand-written asyncio stream {label}")
        if manager is not None:
            await manager.aclose()
        a, h = _median(aio[1:]), (_median(hand[1:]) if hand else None)
        host_us = _median(cpu[1:]) / batches * 1e6
        base = "queued, an event a batch" if queued else "synchronize after each"
        table.add(
            f"{batches} batches of {batch // 1024} KiB, {label} (hand: {base})",
            f"host {host_us:.0f} us/batch",
            1,
            h and h * 1e3,
            a * 1e3,
            _ratio(a, h),
        )
        row = {"job": f"stream {label}", "hand_s": h, "aiocubie_s": a, "host_cpu_us_per_batch": host_us}
        if floor:
            f = row["floor_s"] = _median(floor[1:])
            table.add(
                f"... the same, hand-written asyncio: {tasks} task(s), a pool allocation a batch, events polled",
                f"aiocubie {_ratio(a, f)} of it",
                1,
                h and h * 1e3,
                f * 1e3,
                _ratio(f, h),
            )
        rows.append(row)


_ACTIVATION = re.compile(r"activate|set_current|on_device|make_current|cuCtx(Push|Pop|SetCurrent|GetCurrent)")


def _activation_seconds(stats: pstats.Stats) -> float:
    """Host seconds spent making the device current: the activation functions' own time, and the time of
    what they call directly (the driver calls of a context push and pop)."""
    table = stats.stats  # type: ignore[attr-defined]

    def activating(func: tuple[str, int, str]) -> bool:
        file, _line, name = func
        return bool(_ACTIVATION.search(name)) or (name in ("push", "pop") and "cudadrv" in file)

    seconds = 0.0
    for func, (_cc, _nc, tt, _ct, callers) in table.items():
        if activating(func):
            seconds += tt
        else:
            seconds += sum(entry[2] for caller, entry in callers.items() if activating(caller))
    return seconds


async def profile_stream(kit: Any, mgr: MemoryManager, batch: int, batches: int, out: Path) -> dict[str, Any]:
    """cProfile of the one-at-a-time batch stream: the share of host time making the device current."""
    shape = (batch // 4096, 1024)
    xs = [kit.pinned(mgr, shape) for _ in range(batches)]
    ys = [kit.pinned(mgr, shape) for _ in range(batches)]
    for x in xs:
        _values(shape, x)
    await aio_stream(mgr, kit, xs, ys, 4 * batch * 4, 1, 1)  # warm
    profiler = cProfile.Profile()
    profiler.enable()
    await aio_stream(mgr, kit, xs, ys, 4 * batch * 4, 1, 1)
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    activation = sum(
        tt
        for (_file, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items()
        if _ACTIVATION.search(name)  # type: ignore[attr-defined]
    )
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    (out / f"{kit.name}-pipeline-profile.txt").write_text(text.getvalue())
    return {
        "host_s_per_batch": total / batches,
        "activation_share": activation / total if total else 0.0,
        "phases_us": await _phases(kit, mgr, xs, ys, 4 * batch * 4),
    }


async def _phases(kit: Any, mgr: MemoryManager, xs: list[Any], ys: list[Any], budget: int) -> dict[str, float]:
    """Median microseconds of each phase of a one-at-a-time batch (aio_stream's loader, taken apart)."""
    owner = _Owner()
    mgr.register(owner, proportion=budget / mgr.pool.memory_info().total)
    requests = walk_requests(
        {"x": ArrayRequest.like(xs[0], chunk_axis=0), "y": ArrayRequest.like(ys[0], chunk_axis=0)}, 2
    )
    names = ("request", "walk up to the body", "body (the kernel launch)", "walk after the body", "release")
    times: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter_ns
    try:
        for repeat in range(3):
            for b in range(len(xs)):
                t0 = clock()
                pending = mgr.request(owner, requests, ordered=True)
                response = await pending.__aenter__()
                t1 = clock()
                walk = walk_chunks(response, inputs={"x": xs[b]}, outputs={"y": ys[b]}, depth=2, overlap=True)
                chunk = await walk.__anext__()
                t2 = clock()
                kit.kernel(chunk.stream, chunk.device["x"], chunk.device["y"])
                t3 = clock()
                async for _ in walk:  # the copy out, awaited
                    pass
                t4 = clock()
                await pending.__aexit__(None, None, None)
                t5 = clock()
                if repeat:  # the first round warms
                    for name, ns in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                        times[name].append(ns / 1e3)
    finally:
        mgr.unregister(owner)
    return {name: round(_median(values), 1) for name, values in times.items()}


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("simulator", "cuda"), default="simulator")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--only", choices=("layouts", "pageable", "stream"), action="append")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    kit: Any = CudaKit() if args.backend == "cuda" else SimKit()
    only = set(args.only or ("layouts", "pageable", "stream"))
    data = 256 * MIB // kit.scale // (4 if args.quick else 1)
    batch = MIB // (kit.scale // 8 if kit.scale > 8 else 1)
    batches = 16 if args.quick else 64
    repeats = 2 if args.quick else 5
    table = Table(
        f"Real jobs ({kit.name}): aiocubie against hand-written CuPy, same run",
        ["job", "shape", "chunks", "hand-written ms", "aiocubie ms", "ratio"],
    )
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    async with kit.manager(data // 4) as mgr:
        if "layouts" in only:
            await run_layouts(kit, mgr, data, repeats, table, rows)
        if "pageable" in only:
            await run_pageable(kit, mgr, data, repeats, table, rows)
        if "stream" in only:
            await run_stream(kit, mgr, batch, batches, repeats, table, rows)
        if args.profile:
            extra["profile"] = await profile_stream(kit, mgr, batch, batches, args.out)
    name = args.name or f"{kit.name}-pipeline"
    report = f"# bench_pipeline ({kit.name}, data {data // MIB} MiB, budget a quarter)\n\n{table.markdown()}\n"
    if "profile" in extra:
        p = extra["profile"]
        report += (
            f"\nOne-at-a-time batch stream under cProfile: {p['host_s_per_batch'] * 1e6:.0f} us of host time a batch, "
            f"{p['activation_share'] * 100:.1f}% of it making the device current.\n"
            f"Phases of one batch, median us: {p['phases_us']}\n"
        )
    print(report)
    (args.out / f"{name}.md").write_text(report)
    (args.out / f"{name}.json").write_text(
        json.dumps({"machine": machine(), "rows": rows, **extra}, indent=1, default=str)
    )
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
