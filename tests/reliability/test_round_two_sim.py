"""Issue 22, the simulator's part: what would corrupt memory on a GPU must fail loudly here.

Staging buffers outlive the copies that use them; pooled host arrays outlive their views;
released arrays cannot be used; the pinned pool gives back what it no longer needs. Each test
keeps the shape of the reproduction in the issue.
"""

from __future__ import annotations

import gc
import random
import time
import warnings

import anyio
import numpy as np
import pytest
from _reliability import LOOPS

from aiocubie import (
    AiocubieError,
    ArrayRequest,
    BackendError,
    ConfigurationError,
    Engines,
    InvalidRequestError,
    MemoryManager,
    ReleasedError,
    SimulatorBackend,
    walk_chunks,
)

pytestmark = pytest.mark.anyio

MiB = 1 << 20


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


def _walk_requests(shape: tuple[int, int]) -> dict[str, ArrayRequest]:
    return {label: ArrayRequest(shape, np.float32, chunk_axis=0, buffers=2) for label in ("x", "y")}


async def test_set_allocator_during_an_overlapped_walk_leaves_no_copy_behind() -> None:
    """Item 3: the walk's streams are closed by the reset with copies still queued; the walk
    must wait for them before its staging buffers go back, and the next walk is exact."""
    engines = Engines(h2d_bandwidth=2e7, d2h_bandwidth=2e7, copy_latency=0.01)
    sim = SimulatorBackend(total=2 * MiB, engines=engines)
    shape = (20, 50_000)
    requests = _walk_requests(shape)
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
                        mgr.set_allocator("cupy")
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


async def test_a_pooled_host_array_stays_out_of_the_pool_while_a_view_lives() -> None:
    """Item 4: the buffer went back when the array was collected although a view of it lived;
    the next pooled array then aliased the view."""
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim) as mgr:
        array = mgr.create_host_array((4, 256), np.float32, pool=True)
        array[...] = 1.0
        view = array[1:3]
        assert sim.device.is_pinned(view)
        del array
        gc.collect()
        other = mgr.create_host_array((4, 256), np.float32, pool=True)
        other[...] = 2.0
        assert not np.shares_memory(view, other)
        np.testing.assert_array_equal(view, 1.0)
        assert mgr.stats().pinned.in_use == 2 * other.nbytes
        del view, other
        gc.collect()
        assert mgr.stats().pinned.in_use == 0  # both buffers back once nothing views them
    sim.close()


async def test_walk_chunks_after_the_async_with_ended_raises_released_error() -> None:
    """Silent damage: the walk copied into the freed arrays without an error."""
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim) as mgr:
        comp = object()
        mgr.register(comp)
        x = np.ones((8, 16), np.float32)
        y = np.zeros_like(x)
        async with mgr.request(comp, _walk_requests(x.shape)) as response:
            pass
        with pytest.raises(ReleasedError, match=r"walk_chunks.*released"):
            async for _ in walk_chunks(response, inputs={"x": x}, outputs={"y": y}):
                pass
        np.testing.assert_array_equal(y, 0)  # nothing copied
        # released in the body: refused before the copy out
        response = await mgr.request(comp, {"x": ArrayRequest((8, 16), np.float32, chunk_axis=0)})
        with pytest.raises(ReleasedError):
            async for _ in walk_chunks(response, inputs={"x": x}, outputs={"x": y}):
                mgr.release(response)
        np.testing.assert_array_equal(y, 0)
    sim.close()


@pytest.mark.parametrize("how", ["release", "free", "free_all", "async with", "set_allocator"])
async def test_an_array_kept_past_its_release_refuses_every_use(how: str) -> None:
    """Silent damage: an array kept past mgr.release(r) could still be read and written."""
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim) as mgr:
        comp = object()
        mgr.register(comp)
        requests = {"x": ArrayRequest((4, 8), np.float32)}
        if how == "async with":
            async with mgr.request(comp, requests) as response:
                kept = response.arrays["x"]
                view = kept[1:]
        else:
            response = await mgr.request(comp, requests)
            kept = response.arrays["x"]
            view = kept[1:]
            if how == "release":
                mgr.release(response)
            elif how == "free":
                mgr.free("x", comp)
            elif how == "free_all":
                mgr.free_all()
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    mgr.set_allocator("cupy")
        assert response.released == {"x"}
        for use in (
            kept.get,
            lambda: kept.fill(1.0),
            lambda: kept.__setitem__(0, 2.0),
            lambda: float(view.sum()),
            lambda: kept + 1,
            lambda: kept.set(np.zeros((4, 8), np.float32)),
            lambda: kept[1:],
        ):
            with pytest.raises(ReleasedError, match="released"):
                use()
        with pytest.raises(ReleasedError):
            await mgr.to_device(comp, [np.zeros((4, 8), np.float32)], [kept])
    sim.close()


async def _staged_walk(mgr: MemoryManager, comp: object, runs: int) -> None:
    x = np.ones((runs, 256), np.float32)
    y = np.zeros_like(x)
    async with mgr.request(comp, _walk_requests(x.shape)) as response:
        async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}, depth=2):
            chunk.device["y"][...] = chunk.device["x"]
    np.testing.assert_array_equal(y, 1)


@pytest.mark.parametrize("pattern", ["growing", "random", "two groups"])
async def test_the_pinned_pool_holds_at_most_1_1x_its_peak_in_use(pattern: str) -> None:
    """Item 7: 40 walks whose runs grow 5% each left 18x the peak in use pinned (2.8-4.2x for
    random sizes in one range, 2-3.6x for two groups walking at once); the target is 1.1x."""
    rng = random.Random(22)
    sim = SimulatorBackend(total=64 * MiB)
    async with MemoryManager(sim) as mgr:
        a, b = object(), object()
        mgr.register(a, stream_group="a")
        mgr.register(b, stream_group="b")
        runs = 100.0
        for _ in range(40):
            if pattern == "growing":
                runs *= 1.05
                await _staged_walk(mgr, a, int(runs))
            elif pattern == "random":
                await _staged_walk(mgr, a, rng.randrange(100, 700))
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_staged_walk, mgr, a, rng.randrange(100, 700))
                    tg.start_soon(_staged_walk, mgr, b, rng.randrange(100, 700))
            pinned = mgr.stats().pinned
            assert pinned.in_use == 0
            assert pinned.held <= 1.1 * pinned.peak_in_use, pinned
        assert mgr.release_pinned() == pinned.held
    sim.close()


@pytest.mark.parametrize("thing", [5, "m", None, [1.0, 2.0], np.zeros(4, np.float32)], ids=repr)
async def test_prefetch_and_advise_refuse_a_non_array_even_with_a_fault_injected(thing: object) -> None:
    """Item 11: prefetch of a non-array was accepted; with an injected prefetch fault the
    simulator raised a raw AttributeError instead of the injected BackendError."""
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim) as mgr:
        comp = object()
        mgr.register(comp)
        sim.faults.inject("prefetch")
        with pytest.raises(InvalidRequestError, match="prefetch needs a managed array"):
            await mgr.prefetch(comp, thing)
        with pytest.raises(InvalidRequestError, match="advise needs a managed array"):
            mgr.advise(thing, "read_mostly")
        async with mgr.request(comp, {"m": ArrayRequest((8,), np.float32, "managed")}) as response:
            with pytest.raises(BackendError, match="injected fault: prefetching 32 bytes"):
                await mgr.prefetch(comp, response.arrays["m"])  # the fault is still armed
            await mgr.prefetch(comp, response.arrays["m"])
    sim.close()


@pytest.mark.parametrize(
    "bad",
    [{"h2d_bandwidth": "fast"}, {"d2h_bandwidth": None}, {"copy_latency": float("nan")}, {"kernel_latency": True}],
    ids=repr,
)
def test_engines_refuse_a_value_that_is_not_a_number(bad: dict[str, object]) -> None:
    """Item 9: Engines(h2d_bandwidth="fast") was accepted and failed later on a stream's thread."""
    name, value = next(iter(bad.items()))
    with pytest.raises(ConfigurationError, match=rf"Engines\({name}={value!r}\)"):
        Engines(**bad)  # type: ignore[arg-type]


async def test_launch_refuses_bad_arguments_at_the_call() -> None:
    """Item 9: sim.launch(5), duration=-1 or nan, work=5 were accepted and failed on the stream's thread."""
    sim = SimulatorBackend(total=MiB)
    stream = sim.device.create_stream()
    for args, kwargs, named in [
        ((5,), {}, "got 5"),
        ((stream,), {"duration": -1}, "got -1"),
        ((stream,), {"duration": float("nan")}, "got nan"),
        ((stream,), {"duration": "1"}, "got '1'"),
        ((stream, 5), {}, "got 5"),
    ]:
        with pytest.raises(InvalidRequestError, match=named):
            sim.launch(*args, **kwargs)  # type: ignore[arg-type]
    ran: list[int] = []
    sim.launch(stream, lambda: ran.append(1), duration=0.001, tag="ok")
    sim.device.record_event(stream).synchronize()
    assert ran == [1]
    assert [entry.tag for entry in sim.timeline[:3]] == ["ok"]  # a list: it slices
    sim.close()
