"""The batch stream on a real GPU: ordered requests that do not wait behind a busy stream, and the
The loader of docs/concepts/walks.md ("A batch stream") with k batches in flight, every output checked, everything freed.

Skipped without a GPU (see conftest.py).
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager, current_cupy_stream, walk_batches, walk_chunks, walk_requests

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


class Loader:
    """A component that walks batches."""


async def test_an_ordered_request_does_not_wait_behind_a_busy_stream(cuda_backend: Any, kernels: Any) -> None:
    cupy = pytest.importorskip("cupy")
    async with MemoryManager(cuda_backend) as mgr:
        owner = Loader()
        mgr.register(owner)
        stream = mgr.groups.stream(owner)
        with current_cupy_stream(stream):
            flag = cupy.zeros(1, np.int32)
        kernels.sleep(stream, flag, 200_000_000)  # the stream is busy for 0.2 s
        requests = {"x": ArrayRequest((1024,), np.float32, zero=True)}
        response = await mgr.request(owner, requests, ordered=True)
        assert not response.ready.query()  # resolved before the device got to the allocation
        kernels.add_one(stream, response.arrays["x"])  # ordered after the allocation and its zero fill
        plain = await mgr.request(owner, requests)  # the default waits for its event
        assert plain.ready.query() and response.ready.query()
        assert int(flag.get()[0]) == 1
        assert (response.arrays["x"].get() == 1).all()
        mgr.release(response)
        mgr.release(plain)
        assert mgr.stats().live_bytes == 0


@pytest.mark.parametrize("k, groups", [(1, 1), (4, 1), (4, 4)])
async def test_the_readme_loader_gets_every_output(cuda_backend: Any, k: int, groups: int) -> None:
    cupy = pytest.importorskip("cupy")
    async with MemoryManager(cuda_backend) as mgr:
        xs = [mgr.host.array((256, 1024), np.float32, "pinned") for _ in range(32)]
        ys = [mgr.host.array((256, 1024), np.float32, "pinned") for _ in xs]
        for b, x in enumerate(xs):
            x[...] = b
        owners = [Loader() for _ in range(k)]
        for i, owner in enumerate(owners):
            mgr.register(owner, stream_group=f"g{i % groups}")
        requests = walk_requests({"x": ArrayRequest.like(xs[0]), "y": ArrayRequest.like(ys[0])}, depth=2)

        async def worker(i: int) -> None:
            for x, y in zip(xs[i::k], ys[i::k]):
                async with mgr.request(owners[i], requests, ordered=True) as response:
                    async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, overlap=True):
                        with current_cupy_stream(chunk.stream):
                            cupy.multiply(chunk.device["x"], 2, out=chunk.device["y"])

        async with anyio.create_task_group() as tg:
            for i in range(k):
                tg.start_soon(worker, i)
        for x, y in zip(xs, ys):
            np.testing.assert_array_equal(y, 2 * x)
        assert mgr.stats().live_bytes == 0


@pytest.mark.parametrize("in_flight", [1, 4])
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
async def test_walk_batches_gets_every_output(cuda_backend: Any, in_flight: int, pinned: bool) -> None:
    cupy = pytest.importorskip("cupy")
    async with MemoryManager(cuda_backend) as mgr:
        shape = (256, 1024)
        make = (
            (lambda: mgr.host.array(shape, np.float32, "pinned")) if pinned else (lambda: np.empty(shape, np.float32))
        )
        xs = [make() for _ in range(32)]
        ys = [make() for _ in xs]
        for b, (x, y) in enumerate(zip(xs, ys)):
            x[...] = b
            y[...] = np.nan
        owner = Loader()
        mgr.register(owner)
        requests = {"x": ArrayRequest.like(xs[0]), "y": ArrayRequest.like(ys[0])}
        async with mgr.request(owner, requests, ordered=True) as response:
            pairs = (({"x": x}, {"y": y}) for x, y in zip(xs, ys))
            async for chunk in walk_batches(response, pairs, in_flight=in_flight):
                with current_cupy_stream(chunk.stream):
                    cupy.multiply(chunk.device["x"], 2, out=chunk.device["y"])
        for x, y in zip(xs, ys):
            np.testing.assert_array_equal(y, 2 * x)
        assert mgr.stats().live_bytes == 0
