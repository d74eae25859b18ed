"""The batch stream attacked (review of issue 21): seeded loaders on asyncio, trio and uvloop.

k tasks in one group or several push batches through request -> walk -> release, mixing ordered
and unordered requests, overlapped and serial walks, one-chunk and chunked batches, ready hooks
(plain and async), and at random: cancellation mid-stream, a release in the body, a release while
the device still runs the batch's kernel, an early break, injected copy faults. Whatever happens,
every batch that ran to its end has numpy's outputs, no engine touched freed memory (the
simulator's sticky error stays clear), no stream work failed, and everything is given back.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import anyio
import numpy as np
import pytest
from _reliability import LOOPS, SEEDS

from aiocubie import ArrayRequest, MemoryManager, walk_chunks, walk_requests
from aiocubie._backends._sim import host_data
from aiocubie.errors import AiocubieError, ContextResetError, PlanningError, ReleasedError
from aiocubie.simulator import Engines, SimulatorBackend

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::aiocubie.errors.AiocubieWarning")]

ROW = 64  # float32 values a run


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


async def _stream(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(seed)
    k, groups = rng.choice([1, 2, 4, 6]), rng.choice([1, 2, 3])
    engines = Engines(h2d_bandwidth=4e9, d2h_bandwidth=4e9, copy_latency=rng.choice([0.0, 2e-4]))
    # small enough that the larger batches chunk when several are in flight
    sim = SimulatorBackend(rng.choice([24, 48, 4096]) * ROW * 4 * 2 * 2, engines=engines)
    faults = rng.random() < 0.3
    reset = rng.random() < 0.3  # a context reset mid-stream
    done: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
    insufficient: list[int] = []
    hooked: list[tuple[bool, bool]] = []  # (ordered response ready when its hook ran, arrays released)

    def hook(response: Any) -> None:
        ready = response.ready
        hooked.append((ready is None or ready.query(), bool(response.released)))

    async def async_hook(response: Any) -> None:
        await anyio.sleep(0)
        hook(response)

    with caplog.at_level(logging.ERROR, logger="aiocubie"):
        async with MemoryManager(sim, headroom=0.0) as mgr:
            owners = [object() for _ in range(k)]
            for i, owner in enumerate(owners):
                mgr.register(owner, stream_group=f"g{i % groups}", ready_hook=hook if i % 2 else async_hook)
            if faults:
                sim.faults.inject("copy", probability=0.05, times=None, seed=seed)

            async def batch(i: int, b: int) -> None:
                brng = random.Random(seed * 1000 + b)
                runs = brng.choice([1, 3, 16, 64])
                depth = brng.choice([1, 2])
                overlap = brng.choice([None, True, False])
                ordered = brng.random() < 0.6
                action = brng.choices(
                    ["normal", "cancel", "release_in_body", "break", "release_busy"], [6, 1, 1, 1, 1]
                )[0]
                x = np.arange(runs * ROW, dtype=np.float32).reshape(runs, ROW) + b
                y = np.full_like(x, np.nan)
                requests = walk_requests(
                    {"x": ArrayRequest(x.shape, np.float32, chunk_axis=0), "y": ArrayRequest(x.shape, np.float32)},
                    depth,
                )
                with anyio.CancelScope() as scope:
                    if action == "cancel":
                        scope.deadline = anyio.current_time() + brng.uniform(0, 3e-3)
                    async with mgr.request(owners[i], requests, ordered=ordered) as response:
                        if action == "release_busy":  # a kernel still runs on the arrays at the release
                            dx = host_data(response.arrays["x"])
                            sim.launch(response.stream, lambda dx=dx: dx.copy(), duration=1e-3)
                            mgr.release(response)
                            return
                        walked = walk_chunks(response, inputs={"x": x}, outputs={"y": y}, overlap=overlap)
                        try:
                            async for chunk in walked:
                                dx, dy = host_data(chunk.device["x"]), host_data(chunk.device["y"])
                                sim.launch(chunk.stream, lambda dx=dx, dy=dy: np.multiply(dx, 2, out=dy))
                                if action == "release_in_body" and chunk.index == 0:
                                    mgr.release(response)
                                if action == "break":
                                    break
                        except ReleasedError:
                            assert action == "release_in_body" or reset
                            return
                        finally:
                            await walked.aclose()
                        if action == "normal":
                            done.append((x, y))

            async def worker(i: int) -> None:
                for b in range(i, 6 * k, k):
                    try:
                        await batch(i, b)
                    except PlanningError:  # the other batches in flight hold the device
                        insufficient.append(b)
                    except (ContextResetError, ReleasedError) as exc:
                        assert reset, exc
                    except AiocubieError as exc:  # an injected copy fault fails that batch only
                        assert (faults and "injected fault" in str(exc)) or (reset and "reset" in str(exc)), exc

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for i in range(k):
                        tg.start_soon(worker, i)
                    if reset:
                        await anyio.sleep(rng.uniform(0, 0.02))
                        mgr.pool.invalidate_all()
            for stream in {mgr.groups.stream(owner) for owner in owners}:
                await anyio.to_thread.run_sync(stream.synchronize)
            assert mgr.stats().live_bytes == 0
            assert mgr.backend.device.pinned_pool.in_use == 0
    case = f"seed {seed}: k {k}, groups {groups}, faults {faults}, reset {reset}"
    assert sim.device.sticky is None, f"{case}: {sim.device.sticky}"
    failed = [r.getMessage() for r in caplog.records if "stream work failed" in r.getMessage()]
    assert not failed, f"{case}: {failed}"
    assert sim.used == 0, case
    assert len(insufficient) < 6 * k, case
    for x, y in done:
        assert np.array_equal(y, 2 * x), case
    assert all(ready for ready, _ in hooked), f"{case}: a ready hook ran before the allocation's event"


@pytest.mark.parametrize("seed", SEEDS)
async def test_batch_streams_under_attack_keep_every_promise(seed: int, caplog: pytest.LogCaptureFixture) -> None:
    for case in range(4):
        await _stream(100 * seed + case, caplog)
