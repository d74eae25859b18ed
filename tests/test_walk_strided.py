"""Walks of every layout (issue 21): the run axis first, in the middle or last, 2-D and 3-D.

Pinned host arrays go straight between their chunk slices and the chunk buffers in one strided
copy each (no staging); pageable ones are packed into pinned staging on host threads. Either
way, every depth gives numpy's result byte for byte, in-place arrays included. Runs on the
simulator under asyncio and trio; the copies are read from its timeline.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager, walk_chunks, walk_requests
from aiocubie.simulator import SimulatorBackend

RUNS = 11
MAX_CHUNK = 3
#: name -> (host shape, run axis)
LAYOUTS = {
    "first-2d": ((RUNS, 6), 0),
    "last-2d": ((6, RUNS), 1),
    "first-3d": ((RUNS, 4, 5), 0),
    "middle-3d": ((4, RUNS, 5), 1),
    "last-3d": ((4, 5, RUNS), 2),
}


async def _walk(shape: tuple[int, ...], axis: int, depth: int, pinned: bool) -> dict[str, Any]:
    """y = 3 x + 1 and z -= x (z in place), chunk by chunk; the host arrays and what the walk used."""
    dtype = np.dtype(np.float32)
    requests = {label: ArrayRequest(shape, dtype, chunk_axis=axis) for label in ("x", "y", "z")}
    per_run = 3 * math.prod(shape) // shape[axis] * dtype.itemsize
    sim = SimulatorBackend(depth * per_run * MAX_CHUNK + per_run // 2)
    rng = np.random.default_rng(depth)
    data = {"x": rng.standard_normal(shape).astype(dtype), "z": rng.standard_normal(shape).astype(dtype)}
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        if pinned:
            host = {label: mgr.host.array(shape, dtype, "pinned", like=data[label]) for label in ("x", "z")}
            host["y"] = mgr.host.array(shape, dtype, "pinned")
        else:
            host = {"x": data["x"].copy(), "z": data["z"].copy(), "y": np.zeros(shape, dtype)}
        async with mgr.request(solver, walk_requests(requests, depth)) as response:
            assert response.chunks == math.ceil(RUNS / MAX_CHUNK)
            async for chunk in walk_chunks(
                response, inputs={"x": host["x"], "z": host["z"]}, outputs={"y": host["y"], "z": host["z"]}
            ):
                d = chunk.device
                d["y"][...] = d["x"] * 3 + 1
                d["z"][...] = d["z"] - d["x"]
        pinned_stats = mgr.stats().pinned
    return {
        **{label: np.array(array) for label, array in host.items()},
        "data": data,
        "chunks": response.chunks,
        "staged": pinned_stats.peak_in_use,
        "staged_now": pinned_stats.in_use,
        "copies": [entry.tag for entry in sim.timeline if entry.op == "copy"],
        "used": sim.used,
    }


@pytest.mark.anyio
@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_every_layout_equals_numpy_byte_for_byte(layout: str, pinned: bool, depth: int) -> None:
    shape, axis = LAYOUTS[layout]
    walked = await _walk(shape, axis, depth, pinned)
    x, z = walked["data"]["x"], walked["data"]["z"]
    assert walked["y"].tobytes() == (x * 3 + 1).tobytes()
    assert walked["z"].tobytes() == (z - x).tobytes()  # in place: read, then written, chunk by chunk
    chunks = walked["chunks"]
    # one copy per chunk and array each way, on the copy engines: no chunk is split or repeated
    ins = sorted(tag for tag in walked["copies"] if tag[0] == "in")
    outs = sorted(tag for tag in walked["copies"] if tag[0] == "out")
    assert ins == sorted(("in", i, label) for i in range(chunks) for label in ("x", "z"))
    assert outs == sorted(("out", i, label) for i in range(chunks) for label in ("y", "z"))
    if pinned:  # straight between the host slices and the buffers
        assert walked["staged"] == 0
    else:  # through pinned staging: a buffer per array, direction and buffer set, given back
        chunk_bytes = walked["x"].nbytes // RUNS * MAX_CHUNK
        assert walked["staged"] == 4 * depth * chunk_bytes
    assert walked["staged_now"] == 0 and walked["used"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("layout", ["last-2d", "middle-3d"])
async def test_a_non_contiguous_pinned_host_view_is_staged_and_still_exact(layout: str) -> None:
    # a pinned host array reversed along a non-run axis: no copy engine geometry reads it, so the
    # walk packs it (on host threads) into contiguous staging, and the result is still numpy's
    shape, axis = LAYOUTS[layout]
    dtype = np.dtype(np.int32)
    per_run = 2 * math.prod(shape) // shape[axis] * dtype.itemsize
    sim = SimulatorBackend(2 * per_run * MAX_CHUNK + per_run // 2)
    async with MemoryManager(sim, headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        base = mgr.host.array(shape, dtype, "pinned")
        base[...] = np.arange(base.size, dtype=dtype).reshape(shape)
        x = base[::-1]  # reversed along axis 0, which is not the run axis here
        y = mgr.host.array(shape, dtype, "pinned")
        requests = {label: ArrayRequest(shape, dtype, chunk_axis=axis) for label in ("x", "y")}
        async with mgr.request(solver, walk_requests(requests, 2)) as response:
            assert response.chunks > 1
            async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}):
                chunk.device["y"][...] = chunk.device["x"] * 2
        assert mgr.stats().pinned.peak_in_use > 0
    assert y.tobytes() == (x * 2).tobytes()


def test_the_cuda_backend_reads_a_host_views_address_as_numpy_does() -> None:
    # the CUDA copies' host side (no GPU needed, but the CUDA backend's modules import cuda.bindings,
    # which the numba-free CI job does not install): the first element of any view, strides as numpy's
    pytest.importorskip("cuda.bindings", reason="the CUDA backend needs cuda-bindings (the numba or cuda extra)")
    from aiocubie._backends._cuda._arrays import host_address, pointer_and_contiguity, pointer_and_strides

    base = np.zeros((6, 8, 4), np.float32)
    for view in (base, base[2:, 1::3], base[..., ::-1], base.T, base[3:3]):
        assert host_address(view) == view.ctypes.data
        assert pointer_and_strides(view) == (view.ctypes.data, view.strides)
        assert pointer_and_contiguity(view) == (view.ctypes.data, view.flags.c_contiguous)
