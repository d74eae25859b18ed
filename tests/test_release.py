"""Release: a released response's arrays fail loudly on the simulator, whatever their kind and array type,
however they were released (release, free, free_all, the end of ``async with``, a reset) and however they
are used (a read, a write, a view, a copy, a walk); ``mgr.release`` takes only this manager's responses."""

from __future__ import annotations

import copy
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest
from simkit import LOOPS, Part, needs_numba, xy_requests

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager, walk_batches, walk_chunks
from aiocubie.errors import InvalidRequestError, ReleasedError
from aiocubie.simulator import SimulatorBackend

MiB = 1 << 20


@pytest.mark.anyio
@pytest.mark.parametrize(
    "use",
    [
        lambda x: x.get(),
        lambda x: x.fill(1.0),
        lambda x: x + 1,
        lambda x: x.set(np.ones(4, np.float32)),
        lambda x: x[1:],
        repr,
    ],
    ids=["get", "fill", "add", "set", "slice", "repr"],
)
async def test_a_released_mapped_array_refuses_every_use(anyio_backend: str, use: Callable[[Any], Any]) -> None:
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"x": ArrayRequest((4,), np.float32, kind="mapped")})
        mapped = response.arrays["x"]
        mgr.release(response)
        with pytest.raises(ReleasedError, match="released"):
            use(mapped)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["mapped", "pinned", "host"])
async def test_copies_refuse_a_released_response_array_of_any_kind(anyio_backend: str, kind: str) -> None:
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"x": ArrayRequest((4,), np.float32, kind=kind)})
        device = (await mgr.request(part, {"d": ArrayRequest((4,), np.float32)})).arrays["d"]
        released = response.arrays["x"]
        mgr.release(response)
        with pytest.raises(ReleasedError, match="released"):
            await mgr.host.from_device(part, [released], [np.zeros(4, np.float32)])
        with pytest.raises(ReleasedError, match="released"):
            await mgr.host.to_device(part, [released], [device])
        with pytest.raises(ReleasedError, match="released"):
            await mgr.host.to_device(part, [np.zeros(4, np.float32)], [released])
        await mgr.groups.sync(part)
        if isinstance(released, np.ndarray):  # a numpy array cannot refuse: its memory is poisoned instead
            assert np.isnan(released).all()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", LOOPS)
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
                    mgr.pool.set_allocator("cupy")
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
            await mgr.host.to_device(comp, [np.zeros((4, 8), np.float32)], [kept])
    sim.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", LOOPS)
async def test_walk_chunks_after_the_async_with_ended_raises_released_error() -> None:
    """Silent damage: the walk copied into the freed arrays without an error."""
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim) as mgr:
        comp = object()
        mgr.register(comp)
        x = np.ones((8, 16), np.float32)
        y = np.zeros_like(x)
        async with mgr.request(comp, xy_requests(x.shape)) as response:
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


@needs_numba
@pytest.mark.anyio
@pytest.mark.parametrize(
    "use",
    [
        repr,
        str,
        lambda x: x.T,
        lambda x: x.reshape(2, 3),
        lambda x: x.ravel(),
        lambda x: x.view(np.int32),
        lambda x: x.split(1),
        lambda x: x[0],
        lambda x: x.copy_to_host(),
        lambda x: x.copy_to_device(np.ones((3, 2), np.float32)),
    ],
    ids=["repr", "str", "T", "reshape", "ravel", "view", "split", "index", "copy_to_host", "copy_to_device"],
)
async def test_a_released_numba_array_refuses_views_and_reads(anyio_backend: str, use: Callable[[Any], Any]) -> None:
    async with MemoryManager("simulator", array_type="numba") as mgr:
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"x": ArrayRequest((3, 2), np.float32)})
        array = response.arrays["x"]
        use(array)  # live: fine
        mgr.release(response)
        with pytest.raises(ReleasedError, match="released"):
            use(array)


@pytest.mark.anyio
async def test_release_refuses_what_is_not_one_of_its_responses(anyio_backend: str) -> None:
    async with MemoryManager("simulator") as mgr, MemoryManager("simulator") as other:
        part, stranger = Part(), Part()
        mgr.register(part)
        other.register(stranger)
        response = await mgr.request(part, {"x": ArrayRequest((4,), np.float32)})
        foreign = await other.request(stranger, {"x": ArrayRequest((4,), np.float32)})
        for wrong, words in [
            (response.arrays["x"], "(of type SimCupyArray)"),
            (response.arrays, "(of type dict)"),
            ("x", "got 'x' (a label)"),
            (None, "got None (of type NoneType)"),
            (42, "got 42 (of type int)"),
        ]:
            with pytest.raises(InvalidRequestError, match="pass the response itself") as caught:
                mgr.release(wrong)  # type: ignore[arg-type]
            assert words in str(caught.value) and "mgr.free(label, instance)" in str(caught.value)
        with pytest.raises(InvalidRequestError, match="did not hand out"):
            mgr.release(foreign)
        assert mgr.stats().live_bytes == 16 and other.stats().live_bytes == 16  # still held, both
        mgr.release(response)
        mgr.release(response)  # twice: nothing more to free
        other.release(foreign)
        assert mgr.stats().live_bytes == other.stats().live_bytes == 0


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["host", "pinned"])
@pytest.mark.parametrize("role", ["inputs", "outputs"])
async def test_walks_refuse_a_released_host_array_of_any_kind(anyio_backend: str, kind: str, role: str) -> None:
    """A released pageable (host) array is refused by a walk as a pinned one is, and as the copies refuse both."""
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"x": ArrayRequest((4, 3), np.float32, kind=kind)})
        released = response.arrays["x"]
        mgr.release(response)
        async with mgr.request(part, {"d": ArrayRequest((4, 3), np.float32)}) as walked:
            with pytest.raises(ReleasedError, match="released"):
                async for _ in walk_chunks(walked, **{role: {"d": released}}):
                    pass
            with pytest.raises(ReleasedError, match="released"):
                async for _ in walk_batches(
                    walked, [({"d": released}, {}) if role == "inputs" else ({}, {"d": released})]
                ):
                    pass
            with pytest.raises(ReleasedError, match="released"):  # a view of it too
                async for _ in walk_chunks(walked, **{role: {"d": released[:, :]}}):
                    pass


@pytest.mark.anyio
@pytest.mark.parametrize(
    "use",
    [
        lambda x: x == 0,
        lambda x: x != 0,
        lambda x: x // 2,
        lambda x: x % 2,
        lambda x: x & 1,
        lambda x: x | 1,
        lambda x: x ^ 1,
        lambda x: ~x,
        lambda x: x << 1,
        lambda x: x >> 1,
        lambda x: 2**x,
        lambda x: divmod(x, 2),
        lambda x: round(x),
        lambda x: [1, 2][x],
        lambda x: f"{x:.3f}",
    ],
    ids=["eq", "ne", "floordiv", "mod", "and", "or", "xor", "invert", "lshift", "rshift", "rpow", "divmod", "round",
         "index", "format"],
)  # fmt: skip
async def test_a_released_responses_array_refuses_operators_with_the_released_error(
    anyio_backend: str, use: Callable[[Any], Any]
) -> None:
    """What stands in for a released array says so for every operator an array has (not a TypeError, nor a
    quiet False from ``==``); it still prints, hashes and sits in a dict."""
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)
        async with mgr.request(part, {"x": ArrayRequest((4,), np.float32)}) as response:
            pass
        stand_in = response.arrays["x"]
        with pytest.raises(ReleasedError, match="released"):
            use(stand_in)
        assert "released" in repr(stand_in) and "released" in f"{stand_in}" and {stand_in: 1}[stand_in] == 1
        # what the array was, none of its memory: a ready hook of an ordered request may read it late
        assert (stand_in.shape, stand_in.dtype, stand_in.ndim, stand_in.size, stand_in.nbytes) == (
            (4,),
            np.dtype(np.float32),
            1,
            4,
            16,
        )


@pytest.mark.anyio
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
async def test_walk_batches_of_a_released_response_names_the_walk(anyio_backend: str, pinned: bool) -> None:
    """Released before the walk or during it, on the direct path and the staged one: the walk's own error."""
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)

        def batch() -> tuple[dict[str, Any], dict[str, Any]]:
            x = mgr.host.array((4,), np.float32, "pinned") if pinned else np.zeros(4, np.float32)
            return {"x": x}, {}

        async with mgr.request(part, {"x": ArrayRequest((4,), np.float32)}) as response:
            pass
        with pytest.raises(ReleasedError, match="walk_batches: the response's arrays"):
            async for _ in walk_batches(response, [batch()]):
                pass
        response = await mgr.request(part, {"x": ArrayRequest((4,), np.float32)})
        # a staged batch is walked by walk_chunks, which names itself when the release comes in its body
        with pytest.raises(ReleasedError, match="walk_(batches|chunks): the response's arrays"):
            async for _ in walk_batches(response, [batch(), batch()]):
                mgr.release(response)


# -- the response releases itself -----------------------------------------------------------------
@pytest.mark.anyio
async def test_response_release_frees_its_arrays_once_however_often_it_is_called(anyio_backend: str) -> None:
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"x": ArrayRequest((1024,), np.float32)})
        kept = await mgr.request(part, {"y": ArrayRequest((1024,), np.float32)})
        x = response.arrays["x"]
        response.release()
        assert response.released == {"x"} and mgr.stats().live_bytes == 4096
        response.release()  # again: nothing more
        mgr.release(response)  # and through the manager: the same release, nothing more
        assert mgr.stats().live_bytes == 4096 and kept.released == frozenset()
        with pytest.raises(ReleasedError):
            x.get()
        kept.release()
        assert mgr.stats().live_bytes == 0 and sim.used == 0
    sim.close()


@pytest.mark.anyio
async def test_async_with_a_response_releases_it_on_exit_and_aclose_is_idempotent(anyio_backend: str) -> None:
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)
        async with await mgr.request(part, {"x": ArrayRequest((16,), np.float32)}) as response:
            assert response.released == frozenset() and mgr.stats().live_bytes == 64
        assert response.released == {"x"} and mgr.stats().live_bytes == 0
        await response.aclose()
        await response.aclose()
        response.release()
        assert mgr.stats().live_bytes == 0


@pytest.mark.anyio
async def test_response_release_after_the_manager_closed_does_nothing(anyio_backend: str) -> None:
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"x": ArrayRequest((16,), np.float32)})
    assert response.released == {"x"}  # the manager's exit released it
    response.release()
    await response.aclose()
    assert mgr.stats().live_bytes == 0 and sim.used == 0
    sim.close()


@pytest.mark.anyio
async def test_response_release_from_another_task_wakes_a_request_waiting_for_memory(anyio_backend: str) -> None:
    sim = SimulatorBackend(total=4 * MiB)
    async with MemoryManager(sim, mode="active", policy="wait") as mgr:
        holder, waiter = Part(), Part()
        mgr.register(holder, proportion=0.25, stream_group="g")  # the group's cap: 2 MiB
        mgr.register(waiter, proportion=0.25, stream_group="g")
        held = await mgr.request(holder, {"x": ArrayRequest((MiB // 4,), np.float32)})

        async def release_later() -> None:
            await anyio.sleep(0.01)
            held.release()

        async with anyio.create_task_group() as tg:
            tg.start_soon(release_later)
            got = await mgr.request(waiter, {"y": ArrayRequest((MiB // 4,), np.float32)})
            assert held.released == {"x"} and got.chunks == 1  # it waited for the other task's release
        got.release()
        assert mgr.stats().live_bytes == 0
    sim.close()


class _Stream:
    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 0)


def test_a_response_built_by_hand_releases_nothing() -> None:
    response = ArrayResponse({"x": np.zeros(4)}, 1, 4, 4, {"x": (4,)}, {"x": 0}, _Stream())
    response.release()
    assert response.released == frozenset() and isinstance(response.arrays["x"], np.ndarray)


@pytest.mark.anyio
async def test_release_refuses_another_managers_response_that_is_partly_freed(anyio_backend: str) -> None:
    # its freed label made it look released: the release was taken and did nothing, its other arrays held
    async with MemoryManager("simulator") as mgr, MemoryManager("simulator") as other:
        stranger = Part()
        other.register(stranger)
        foreign = await other.request(
            stranger, {"x": ArrayRequest((4,), np.float32), "y": ArrayRequest((4,), np.float32)}
        )
        other.free("x", stranger)
        with pytest.raises(InvalidRequestError, match="did not hand out"):
            mgr.release(foreign)
        assert other.stats().live_bytes == 16 and foreign.released == {"x"}
        other.free("y", stranger)
        mgr.release(foreign)  # every array freed: nothing to refuse, nothing to free
        assert other.stats().live_bytes == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    "use",
    [
        lambda x: setattr(x, "shape", (2, 2)),  # numpy's reshape in place
        lambda x: setattr(x, "dtype", np.int32),  # numpy's view in place
        lambda x: setattr(x, "label", "y"),
    ],
    ids=["shape", "dtype", "label"],
)
async def test_a_write_to_a_released_array_is_refused_and_leaves_other_responses_alone(
    anyio_backend: str, use: Callable[[Any], Any]
) -> None:
    """The stand-ins of a request set's released responses are made once and shared (RequestSet.stand_ins):
    setting an attribute of one, as numpy's ``x.shape = ...`` does, is a use of a released array, and must not
    change what every other response of that request set (released before or after) says it held."""
    requests = {"x": ArrayRequest((4,), np.float32)}
    async with MemoryManager("simulator", batch_window=0) as mgr:
        part = Part()
        mgr.register(part)
        first, second = await mgr.request(part, requests), await mgr.request(part, requests)
        mgr.release(first)
        mgr.release(second)
        with pytest.raises(ReleasedError, match="released"):
            use(first.arrays["x"])
        third = await mgr.request(part, requests)
        mgr.release(third)
        copied = copy.deepcopy(first.arrays["x"])  # a copy (or a pickle) is still made
        for stand_in in (*(r.arrays["x"] for r in (first, second, third)), copied, pickle.loads(pickle.dumps(copied))):
            assert (stand_in.shape, stand_in.dtype, stand_in.label) == ((4,), np.dtype(np.float32), "x")
