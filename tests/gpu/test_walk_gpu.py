"""The overlapped walk on a real GPU: bit-identical to the serial walk, clean when left early.

The body is CuPy work queued on ``chunk.stream`` (through ``current_cupy_stream``), as a user's
would be. Skipped without a GPU (see conftest.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager, current_cupy_stream, walk_chunks, walk_requests

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


class Solver:
    """The walking component."""


async def _walk(backend: Any, depth: int, axis: int, pinned: bool, dtype: Any) -> dict[str, np.ndarray]:
    cupy = pytest.importorskip("cupy")
    shape = (3000, 257) if axis == 0 else (5, 3000, 7)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(dtype)
    async with MemoryManager(backend, mode="active", headroom=0.0) as mgr:
        solver = Solver()
        per_run = 3 * x.nbytes // shape[axis]
        # a budget for 300 runs of depth buffers: about 10 chunks
        mgr.register(solver, proportion=depth * per_run * 300 / mgr.pool.memory_info().total)
        host = {label: mgr.host.array(shape, dtype, "pinned", like=x) if pinned else x.copy() for label in ("x", "z")}
        host["y"] = mgr.host.array(shape, dtype, "pinned") if pinned else np.zeros(shape, dtype)
        requests = {label: ArrayRequest(shape, dtype, chunk_axis=axis) for label in ("x", "y", "z")}
        async with mgr.request(solver, walk_requests(requests, depth)) as response:
            assert response.chunks >= 4
            async for chunk in walk_chunks(
                response,
                inputs={"x": host["x"], "z": host["z"]},
                outputs={"y": host["y"], "z": host["z"]},
                depth=depth,
            ):
                with current_cupy_stream(chunk.stream):
                    d = chunk.device
                    cupy.multiply(d["x"], 3, out=d["y"])
                    cupy.subtract(d["z"], d["x"] * 2, out=d["z"])
        assert mgr.stats().pinned.in_use == 0
        assert mgr.stats().live_bytes == 0
    return host


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int16])
async def test_overlapped_walks_match_the_serial_walk_bit_for_bit(
    cuda_backend: Any, axis: int, pinned: bool, dtype: Any
) -> None:
    serial = await _walk(cuda_backend, 1, axis, pinned, dtype)
    for depth in (2, 3):
        overlapped = await _walk(cuda_backend, depth, axis, pinned, dtype)
        for label in ("y", "z"):
            assert overlapped[label].tobytes() == serial[label].tobytes(), (depth, label)


async def test_leaving_an_overlapped_walk_early_waits_and_leaks_nothing(cuda_backend: Any) -> None:
    async with MemoryManager(cuda_backend, mode="active") as mgr:
        solver = Solver()
        mgr.register(solver, proportion=(64 << 20) / mgr.pool.memory_info().total)
        x = np.ones((4096, 4096), np.float32)
        y = np.zeros_like(x)
        requests = walk_requests({"x": ArrayRequest(x.shape, x.dtype), "y": ArrayRequest(x.shape, x.dtype)}, 2)
        async with mgr.request(solver, requests) as response:
            walk = walk_chunks(response, inputs={"x": x}, outputs={"y": y})
            async with contextlib.aclosing(walk):
                async for chunk in walk:
                    if chunk.index == 2:
                        break
        assert mgr.stats().pinned.in_use == 0 and mgr.stats().live_bytes == 0


#: name -> (host shape, run axis): the run axis first, in the middle, last (issue 21)
LAYOUTS = {
    "first-2d": ((3000, 129), 0),
    "last-2d": ((129, 3000), 1),
    "middle-3d": ((9, 3000, 17), 1),
    "last-3d": ((9, 17, 3000), 2),
}


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_every_layout_equals_numpy_byte_for_byte(
    cuda_backend: Any, layout: str, pinned: bool, depth: int
) -> None:
    # pinned chunks go by 2-D copies straight to their buffers; pageable ones through staging
    cupy = pytest.importorskip("cupy")
    shape, axis = LAYOUTS[layout]
    rng = np.random.default_rng(depth)
    x, z = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    cuda_backend.device.pinned_pool.reset_peak()  # the session's device: earlier walks staged through it
    async with MemoryManager(cuda_backend, mode="active", headroom=0.0) as mgr:
        solver = Solver()
        per_run = 3 * x.nbytes // shape[axis]
        mgr.register(solver, proportion=depth * per_run * 300 / mgr.pool.memory_info().total)  # about 10 chunks
        if pinned:
            host = {label: mgr.host.array(shape, np.float32, "pinned", like=a) for label, a in (("x", x), ("z", z))}
            host["y"] = mgr.host.array(shape, np.float32, "pinned")
        else:
            host = {"x": x.copy(), "z": z.copy(), "y": np.zeros_like(x)}
        requests = {label: ArrayRequest(shape, np.float32, chunk_axis=axis) for label in ("x", "y", "z")}
        async with mgr.request(solver, walk_requests(requests, depth)) as response:
            assert response.chunks >= 4
            async for chunk in walk_chunks(
                response, inputs={"x": host["x"], "z": host["z"]}, outputs={"y": host["y"], "z": host["z"]}
            ):
                with current_cupy_stream(chunk.stream):
                    d = chunk.device
                    cupy.multiply(d["x"], np.float32(3), out=d["y"])
                    cupy.subtract(d["z"], d["x"], out=d["z"])
        stats = mgr.stats()
        assert stats.pinned.in_use == 0 and stats.live_bytes == 0
        if pinned:
            assert stats.pinned.peak_in_use == 0  # nothing staged: straight between host slices and buffers
    assert host["y"].tobytes() == (x * np.float32(3)).tobytes()
    assert host["z"].tobytes() == (z - x).tobytes()
