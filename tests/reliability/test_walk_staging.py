"""Walks whose pageable chunks are packed on staging threads, attacked (review of issue 21).

A staging buffer goes back to the pinned pool when the walk ends, and the next walk may be handed
it at once: a staging thread that still packs into it, or a copy still queued on a stream, then
writes another walk's data. These check that a walk ends only after its staging threads and its
queued copies, however it ends (a release in the body, a reset, a cancellation), and that walks of
odd views give numpy's bytes. On asyncio, trio and uvloop.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import pytest
from _reliability import LOOPS, SEEDS
from simkit import xy_requests

import aiocubie._backends._staging as staging
from aiocubie import ArrayRequest, MemoryManager, walk_chunks, walk_requests
from aiocubie.errors import AiocubieError, ReleasedError
from aiocubie.simulator import Engines, SimulatorBackend

MiB = 1 << 20

pytestmark = pytest.mark.anyio


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def gate_packs(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event, dict[str, bool]]:
    """Make the staging threads' host copies wait for ``gate``; ``started`` is set once one waits,
    and ``packing["done"]`` once one has copied."""
    started, gate, packing = threading.Event(), threading.Event(), {"done": False}
    real = staging.host_copy

    def slow_pack(dst: Any, src: Any) -> None:
        started.set()
        gate.wait(10)
        real(dst, src)
        packing["done"] = True

    monkeypatch.setattr(staging, "host_copy", slow_pack)
    return started, gate, packing


@contextlib.asynccontextmanager
async def a_pageable_walk() -> AsyncIterator[tuple[MemoryManager, Any, np.ndarray]]:
    """A manager, a response of four chunks of x and the pageable x to walk through it."""
    shape = (4, 64)
    async with MemoryManager(SimulatorBackend(1 << 20)) as mgr:
        solver = object()
        mgr.register(solver)
        x = np.arange(256, dtype=np.float32).reshape(shape)
        requests = walk_requests({"x": ArrayRequest(shape, np.float32, chunk_axis=1)}, 2)
        async with mgr.request(solver, requests) as response:
            yield mgr, response, x


async def test_a_walk_cancelled_while_it_waits_for_a_pack_waits_for_the_staging_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the walk popped the pack it awaited from the packs _quiesce waits for: cancelled there, it
    # gave the staging buffer back while the staging thread was still to write it
    async with a_pageable_walk() as (mgr, response, x):
        started, gate, packing = gate_packs(monkeypatch)
        with anyio.CancelScope() as scope:

            async def cancel_once_packing() -> None:
                await anyio.to_thread.run_sync(started.wait)
                threading.Timer(0.3, gate.set).start()  # the walk must wait this long
                scope.cancel()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(cancel_once_packing)
                async for _ in walk_chunks(response, inputs={"x": x}):
                    pass
        assert scope.cancelled_caught
        assert packing["done"], "the walk ended (and gave its staging buffer back) while a staging thread packed it"
        assert mgr.stats().pinned.in_use == 0


async def test_a_reset_while_a_walk_waits_for_a_pack_ends_it_with_released_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # review3: set_allocator while the walk awaited its pack gave a BackendError (the stream closed
    # by the reset) from the copy after it, not the ReleasedError a reset's responses get
    async with a_pageable_walk() as (mgr, response, x):
        started, gate, _ = gate_packs(monkeypatch)

        async def reset_once_packing() -> None:
            await anyio.to_thread.run_sync(started.wait)
            with pytest.warns(Warning, match="resets the device context"):
                mgr.pool.set_allocator("cupy")
            gate.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reset_once_packing)
            with pytest.raises(ReleasedError, match="walk_chunks: the response's arrays"):
                async for _ in walk_chunks(response, inputs={"x": x}):
                    pass
        assert mgr.stats().pinned.in_use == 0


async def test_copies_queued_ahead_never_write_a_block_the_body_released() -> None:
    from aiocubie._backends._sim._arrays import host_data

    runs, row = 12, 1 << 12
    shape = (runs, row)
    engines = Engines(h2d_bandwidth=1e9, d2h_bandwidth=1e9, copy_latency=0.2)  # copies still queued
    sim = SimulatorBackend(7 * 4 * row, engines=engines)  # chunks of 2 runs at depth 3
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        x = mgr.host.array(shape, np.float32, "pinned")
        x[...] = 7
        response = await mgr.request(solver, walk_requests({"x": ArrayRequest(shape, np.float32, chunk_axis=0)}, 3))
        assert response.chunks == 6
        buffers = [host_data(response.buffer("x", slot)) for slot in range(3)]
        with pytest.raises(ReleasedError):
            async for chunk in walk_chunks(response, inputs={"x": x}):
                if chunk.index == 0:  # chunks 0 to 2 are still queued on the copy-in stream
                    mgr.release(response)
        # the walk ended after its queued copies: only then did the blocks go back (poisoned once
        # the group's stream reaches their free); no copy ran on freed memory
        await anyio.to_thread.run_sync(response.stream.synchronize)
        assert sim.device.sticky is None, sim.device.sticky
        for slot in range(3):
            written = np.unique(buffers[slot].view(np.uint8))
            assert written.tolist() == [0xFF], f"chunk buffer {slot} was not freed once the walk ended"
        assert sim.used == 0


async def test_set_allocator_during_an_overlapped_walk_leaves_no_copy_behind() -> None:
    """Issue 22, item 3: the walk's streams are closed by the reset with copies still queued; the walk
    must wait for them before its staging buffers go back, and the next walk is exact."""
    engines = Engines(h2d_bandwidth=2e7, d2h_bandwidth=2e7, copy_latency=0.01)
    sim = SimulatorBackend(total=2 * MiB, engines=engines)
    shape = (20, 50_000)
    requests = xy_requests(shape)
    async with MemoryManager(sim) as mgr:
        comp = object()
        mgr.register(comp)
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        y = np.zeros_like(x)
        with pytest.raises(AiocubieError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            async with mgr.request(comp, requests) as response:
                assert response.chunks > 4
                async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, depth=2):
                    chunk.device["y"][...] = chunk.device["x"]
                    if chunk.index == 3:
                        mgr.pool.set_allocator("cupy")
        returned = time.perf_counter()
        assert mgr.stats().pinned.in_use == 0
        await anyio.sleep(0.2)  # anything still queued would run now
        late = [entry for entry in sim.timeline if entry.op == "copy" and entry.end > returned]
        assert not late, f"copies ran after the walk gave its staging buffers back: {late}"
        x2 = np.full(shape, 7, np.float32)
        y2 = np.zeros_like(x2)
        async with mgr.request(comp, requests) as response:
            async for chunk in walk_chunks(response, inputs={"x": x2}, outputs={"y": y2}, depth=2):
                chunk.device["y"][...] = chunk.device["x"]
        np.testing.assert_array_equal(y2, x2)
    sim.close()


# -- walks of odd views, seeded: every one gives numpy's bytes and gives everything back -------
_DTYPES = [np.uint8, np.int16, np.float32, np.float64, np.complex128, np.bool_]
_LAYOUTS = ["c", "fortran", "stepped", "reversed", "padded", "permuted"]


def _host(rng: random.Random, mgr: MemoryManager, shape: tuple[int, ...], dtype: Any, layout: str, pinned: bool) -> Any:
    """A zeroed host array of ``shape`` laid out as ``layout``, over pinned or pageable memory."""

    def make(base: tuple[int, ...]) -> Any:
        return mgr.host.array(base, dtype, "pinned") if pinned else np.zeros(base, dtype)

    if layout == "fortran":
        return make(shape[::-1]).T
    if layout == "stepped":
        return make(tuple(2 * n for n in shape))[tuple(slice(None, None, 2) for _ in shape)]
    if layout == "reversed":
        return make(shape)[tuple(slice(None, None, -1) for _ in shape)]
    if layout == "padded":  # the last axis a part of a wider one
        return make((*shape[:-1], shape[-1] + 3))[..., 1 : shape[-1] + 1]
    if layout == "permuted":
        order = list(range(len(shape)))
        rng.shuffle(order)
        return make(tuple(shape[a] for a in order)).transpose(np.argsort(order))
    return make(shape)


async def _odd_walk(seed: int) -> None:
    rng = random.Random(seed)
    ndim = rng.choice([1, 2, 3])
    axis = rng.randrange(ndim)
    shape_ = [rng.choice([1, 2, 3, 5]) for _ in range(ndim)]
    shape_[axis] = rng.choice([0, 1, 5, 11, 17])
    shape, dtype, depth = tuple(shape_), np.dtype(rng.choice(_DTYPES)), rng.choice([1, 2, 3])
    per_run = max(1, math.prod(shape) // max(shape[axis], 1)) * dtype.itemsize
    sim = SimulatorBackend(max(4096, 3 * depth * per_run * rng.choice([1, 2, 3]) + per_run // 2))
    values = np.random.default_rng(seed)
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        pinned_in, pinned_out = rng.random() < 0.5, rng.random() < 0.5
        if rng.random() < 0.2:  # broadcast along the run axis: read-only, no copy engine geometry
            row = values.integers(0, 100, [1 if a == axis else n for a, n in enumerate(shape)]).astype(dtype)
            x = np.broadcast_to(row, shape)
        else:
            x = _host(rng, mgr, shape, dtype, rng.choice(_LAYOUTS), pinned_in)
            x[...] = values.integers(0, 100, shape).astype(dtype)
        y = _host(rng, mgr, shape, dtype, rng.choice(_LAYOUTS), pinned_out)
        z = _host(rng, mgr, shape, dtype, rng.choice(_LAYOUTS), pinned_out)
        z[...] = values.integers(0, 100, shape).astype(dtype)
        x0, z0 = np.array(x), np.array(z)
        requests = {label: ArrayRequest(shape, dtype, chunk_axis=axis) for label in ("x", "y", "z")}
        async with mgr.request(solver, walk_requests(requests, depth)) as response:
            async for chunk in walk_chunks(response, inputs={"x": x, "z": z}, outputs={"y": y, "z": z}):
                d = chunk.device
                d["y"][...] = ~d["x"] if dtype == np.bool_ else d["x"] * 3 + 1
                d["z"][...] = d["z"] ^ d["x"] if dtype == np.bool_ else d["z"] - d["x"]
        expected_y = ~x0 if dtype == np.bool_ else (x0 * 3 + 1).astype(dtype)
        expected_z = z0 ^ x0 if dtype == np.bool_ else (z0 - x0).astype(dtype)
        case = f"seed {seed}: {shape} axis {axis} {dtype} depth {depth}"
        assert np.array(y).tobytes() == expected_y.tobytes(), case
        assert np.array(z).tobytes() == expected_z.tobytes(), case
        assert mgr.stats().pinned.in_use == 0, case
    assert sim.used == 0, case


@pytest.mark.parametrize("seed", SEEDS)
async def test_walks_of_odd_views_equal_numpy_byte_for_byte(seed: int) -> None:
    # Fortran order, stepped, reversed, padded, permuted and broadcast host views of 6 dtypes, runs
    # 0 to 17 on any axis, depth 1 to 3, pinned or pageable, in place: 30 walks a seed
    for case in range(30):
        await _odd_walk(1000 * seed + case)
