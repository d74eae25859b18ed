"""The zero-latency device of ``aiocubie._bench``, and the host cost of a batch stream on it,
counted rather than timed: the loop turns a batch takes, and the fresh memory it draws.

``benchmarks/bench_stream_host.py`` times the same loaders; these counts say why a figure moved
(a timer or a poll on the request path costs turns; fresh memory for every block costs page
faults that have nothing to do with aiocubie). On asyncio and trio.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager, walk_chunks, walk_requests
from aiocubie._bench import InstantBackend

SHAPE = (16, 1024)  # 64 KiB of float32, as the benchmark's batches
TASKS = 4
BATCHES = 64  # a task's
pytestmark = pytest.mark.anyio


def _memory(array: Any) -> Any:
    """The memory an array views (itself, if it owns its memory)."""
    return array if array.base is None else array.base


async def _stream(mgr: MemoryManager, bases: list[Any]) -> None:
    """``TASKS`` tasks of one group, each ``BATCHES`` times: request -> walk -> release (the
    benchmark's "4 tasks, one group"); ``bases`` gets the memory under each response's arrays."""
    mgr.backend.device.is_pinned = lambda array: True  # type: ignore[method-assign]  # every host array goes straight
    owners = [object() for _ in range(TASKS)]
    for owner in owners:
        mgr.register(owner, proportion=0.2, stream_group="g")
    x = mgr.host.array(SHAPE, np.float32, kind="pinned")
    x[...] = np.arange(x.size, dtype=np.float32).reshape(SHAPE)
    ys = [mgr.host.array(SHAPE, np.float32, kind="pinned") for _ in owners]
    requests = walk_requests(
        {"x": ArrayRequest(SHAPE, np.float32, chunk_axis=0), "y": ArrayRequest(SHAPE, np.float32, chunk_axis=0)}, 2
    )

    async def worker(i: int) -> None:
        for _ in range(BATCHES):
            async with mgr.request(owners[i], requests, ordered=True) as response:
                bases.extend(map(_memory, response.arrays.values()))
                async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": ys[i]}, overlap=True):
                    np.multiply(chunk.device["x"], 2, out=chunk.device["y"])

    async with anyio.create_task_group() as tg:
        for i in range(TASKS):
            tg.start_soon(worker, i)
    for y in ys:
        np.testing.assert_array_equal(y, 2 * x)


async def test_a_given_back_blocks_memory_serves_the_next_block_of_its_size() -> None:
    async with MemoryManager(InstantBackend(1 << 24)) as mgr:
        owner = object()
        mgr.register(owner)
        request = {"a": ArrayRequest((1024,), np.float32)}
        first = await mgr.request(owner, request)
        memory = _memory(first.arrays["a"])
        mgr.release(first)
        again = await mgr.request(owner, request)
        assert _memory(again.arrays["a"]) is memory  # as a GPU's pool: no fresh memory, no page faults
        other = await mgr.request(owner, {"a": ArrayRequest((512,), np.float32)})
        assert _memory(other.arrays["a"]) is not memory  # another size: fresh memory
        mgr.release(again)
        mgr.release(other)
        assert mgr.backend.resource.used == 0  # type: ignore[attr-defined]


async def test_a_steady_batch_stream_draws_no_fresh_memory_a_batch() -> None:
    # before the device kept given-back memory, each batch's arrays were fresh numpy memory that
    # release freed: the heap went back to the OS and the next batch page-faulted it in again
    # (the benchmark's "4 tasks, one group" went from 111 to 160 us a batch once release dropped its arrays)
    bases: list[Any] = []
    async with MemoryManager(InstantBackend(1 << 30), mode="active", headroom=0.0) as mgr:
        await _stream(mgr, bases)
    assert len(bases) == TASKS * BATCHES * 2
    assert len({id(base) for base in bases}) <= 2 * TASKS  # at most what is alive at once: two arrays a task


@pytest.mark.parametrize(("mode", "policy"), [("active", "chunk"), ("passive", "wait")])
async def test_a_batch_on_a_zero_latency_device_never_waits_on_a_timer(mode: str, policy: str) -> None:
    # nothing on the request path waits on a timer or polls: a busy task counts the loop's turns
    # (0.76 a batch on both loops; one 50 ms timer on the path would be thousands)
    turns = 0

    async def count() -> None:
        nonlocal turns
        while True:
            turns += 1
            await anyio.lowlevel.checkpoint()

    bases: list[Any] = []
    async with MemoryManager(InstantBackend(1 << 30), mode=mode, policy=policy, headroom=0.0) as mgr:
        async with anyio.create_task_group() as tg:
            tg.start_soon(count)
            await _stream(mgr, bases)
            tg.cancel_scope.cancel()
    assert turns <= 2 * TASKS * BATCHES, turns
