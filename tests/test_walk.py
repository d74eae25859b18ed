"""walk_chunks: every element of every input reaches the device and every output comes back.

Runs on the simulator backend under asyncio and trio; the loop body plays the kernel, working
on the device arrays (numpy arrays on the simulator) the chunk hands it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np
import pytest

from aiocubie import ArrayRequest, Chunk, MemoryManager, walk_chunks
from aiocubie.errors import InvalidRequestError
from aiocubie.simulator import SimulatorBackend

RUNS = 7
SHAPES = {0: (RUNS, 3), 1: (2, RUNS, 3), -1: (2, 3, RUNS)}


def _requests(axis: int) -> dict[str, ArrayRequest]:
    shape = SHAPES[axis]
    return {
        "x": ArrayRequest(shape, np.float64, chunk_axis=axis),
        "y": ArrayRequest(shape, np.float64, chunk_axis=axis),
        "p": ArrayRequest((4,), np.float64, unchunkable=True),
        "total": ArrayRequest((1,), np.float64, unchunkable=True, zero=True),
    }


def _total_for(requests: dict[str, ArrayRequest], max_chunk: int) -> int:
    """Simulated memory that fits ``max_chunk`` runs (plus half a run, so rounding cannot bite)."""
    per_run = sum(r.bytes_per_run for r in requests.values())
    whole = sum(r.nbytes for r in requests.values() if r.unchunkable)
    return whole + per_run * max_chunk + per_run // 2


@pytest.mark.anyio
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("max_chunk", range(1, RUNS + 1))
async def test_every_element_round_trips(axis: int, max_chunk: int) -> None:
    requests = _requests(axis)
    x = np.arange(math.prod(SHAPES[axis]), dtype=np.float64).reshape(SHAPES[axis]) + 1
    p = np.array([1.0, 2.0, 3.0, 4.5])
    y = np.full_like(x, np.nan)
    total = np.zeros(1)
    solver = object()
    sim = SimulatorBackend(_total_for(requests, max_chunk))
    async with MemoryManager(sim, headroom=0.0) as mgr:
        mgr.register(solver)
        async with mgr.request(solver, requests) as response:
            assert response.chunks == math.ceil(RUNS / max_chunk)
            chunks: list[Chunk] = []
            async for chunk in walk_chunks(response, inputs={"x": x, "p": p}, outputs={"y": y, "total": total}):
                run_axis = axis % x.ndim
                assert chunk.device["x"].shape[run_axis] == chunk.length
                np.testing.assert_array_equal(chunk.device["x"].get(), chunk.host["x"])
                # The "kernel": y = 2x + sum(p); total += sum(x).
                chunk.device["y"][...] = 2 * chunk.device["x"] + chunk.device["p"].sum()
                chunk.device["total"][0] += chunk.device["x"].sum()
                chunks.append(chunk)
    assert [c.index for c in chunks] == list(range(response.chunks))
    assert [(c.start, c.stop) for c in chunks] == list(response.chunk_ranges())
    assert chunks[0].start == 0 and chunks[-1].stop == RUNS
    np.testing.assert_array_equal(y, 2 * x + p.sum())
    assert total[0] == x.sum()
    assert sim.used == 0


@pytest.mark.anyio
async def test_uneven_last_chunk_is_trimmed() -> None:
    requests = _requests(1)
    async with MemoryManager(SimulatorBackend(_total_for(requests, 3)), headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        x = np.ones(SHAPES[1])
        async with mgr.request(solver, requests) as response:
            lengths = [c.length async for c in walk_chunks(response, inputs={"x": x})]
    assert (response.chunks, response.chunk_length) == (3, 3)
    assert lengths == [3, 3, 1]


@pytest.mark.anyio
async def test_breaking_out_skips_the_remaining_copies() -> None:
    requests = _requests(0)
    x = np.ones(SHAPES[0])
    y = np.zeros(SHAPES[0])
    async with MemoryManager(SimulatorBackend(_total_for(requests, 2)), headroom=0.0) as mgr:
        solver = object()
        mgr.register(solver)
        async with mgr.request(solver, requests) as response:
            walk = walk_chunks(response, inputs={"x": x}, outputs={"y": y})
            async with contextlib.aclosing(walk):
                async for chunk in walk:
                    chunk.device["y"][...] = 5
                    break
    np.testing.assert_array_equal(y, 0)  # the first chunk's body ran, but its copy-out did not


@pytest.mark.anyio
async def test_bad_host_arrays_are_refused() -> None:
    requests = _requests(0)
    async with MemoryManager(SimulatorBackend(1 << 20)) as mgr:
        solver = object()
        mgr.register(solver)
        async with mgr.request(solver, requests) as response:
            with pytest.raises(InvalidRequestError, match="no array 'z'"):
                async for _ in walk_chunks(response, inputs={"z": np.zeros(3)}):
                    pass
            with pytest.raises(InvalidRequestError, match=r"full-size"):
                async for _ in walk_chunks(response, outputs={"y": np.zeros((3, 3))}):
                    pass
            with pytest.raises(InvalidRequestError, match=r"float32"):
                async for _ in walk_chunks(response, inputs={"x": np.zeros(SHAPES[0], np.float32)}):
                    pass


class _Pairs(Mapping[Any, Any]):
    """A mapping kept as a list of pairs: its keys need not be hashable."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs

    def __getitem__(self, key: Any) -> Any:
        return next(value for label, value in self.pairs if label == key)

    def __iter__(self) -> Iterator[Any]:
        return (label for label, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)


# issue 11 item 17: bad arguments are InvalidRequestErrors before anything is copied
@pytest.mark.anyio
async def test_bad_walk_arguments_are_refused_before_any_copy() -> None:
    requests = _requests(0)
    sim = SimulatorBackend(1 << 20)
    async with MemoryManager(sim) as mgr:
        solver = object()
        mgr.register(solver)
        async with mgr.request(solver, requests) as response:
            read_only = np.zeros(SHAPES[0])
            read_only.flags.writeable = False
            x = np.ones(SHAPES[0])
            cases = [
                ({"inputs": {"x": x}, "outputs": {"y": read_only}}, "read-only"),
                ({"inputs": [1, 2]}, r"inputs must be a mapping .* got \[1, 2\]"),
                ({"inputs": x}, "inputs must be a mapping"),
                ({"outputs": "y"}, "outputs must be a mapping .* got 'y'"),
                ({"outputs": {"y": np.zeros(SHAPES[0]).tolist()}}, "outputs are numpy arrays"),
                ({"inputs": {"x": [[1.0], [1.0, 2.0]]}}, "not an array numpy can read"),
                ({"inputs": {("x",): x}}, r"no array \('x',\)"),
                ({"inputs": _Pairs([(["x"], x)])}, r"no array \['x'\]"),  # a mapping whose label is unhashable
            ]
            for kwargs, message in cases:
                copies = sim.faults.fired["copy"]
                sim.faults.inject("copy", times=None)  # any copy attempted would fail differently
                try:
                    with pytest.raises(InvalidRequestError, match=message):
                        async for _ in walk_chunks(response, **kwargs):
                            pass
                finally:
                    sim.faults.clear()
                assert sim.faults.fired["copy"] == copies
            with pytest.raises(InvalidRequestError, match="walks an ArrayResponse"):
                async for _ in walk_chunks({"x": x}):  # type: ignore[arg-type]
                    pass
            with pytest.raises(InvalidRequestError, match="takes one response"):
                async for _ in walk_chunks(response, {"x": x}):
                    pass
            by_hand = attrs.evolve(response, device=None)
            with pytest.raises(InvalidRequestError, match="built by hand"):
                async for _ in walk_chunks(by_hand, inputs={"x": x}):
                    pass


# issue 13 item 11: the response knows its stream and backend; the 0.1 form still walks, with a warning
@pytest.mark.anyio
async def test_the_response_alone_is_walked_and_the_old_form_warns() -> None:
    async with MemoryManager(SimulatorBackend(1 << 20)) as mgr:
        solver = object()
        mgr.register(solver)
        x = np.arange(SHAPES[0][0] * SHAPES[0][1], dtype=np.float64).reshape(SHAPES[0])
        async with mgr.request(solver, _requests(0)) as response:
            assert response.device is mgr.backend.device
            new = [chunk.start async for chunk in walk_chunks(response, inputs={"x": x})]
            with pytest.warns(DeprecationWarning, match=r"call walk_chunks\(response, ...\)") as caught:
                old = [chunk.start async for chunk in walk_chunks(mgr, solver, response, inputs={"x": x})]  # type: ignore[arg-type]
    assert new == old == list(range(0, response.runs, response.chunk_length))
    assert caught[0].filename == __file__  # points at the caller's line


# issue 11 item 16: an empty run axis is walked along with a 1,000-run batch-mate
@pytest.mark.anyio
async def test_an_empty_run_axis_batched_with_a_thousand_runs_is_served_and_walked() -> None:
    sim = SimulatorBackend(2 << 10)  # fits 250 of the thousand runs after headroom: 5 chunks
    async with MemoryManager(sim, batch_window=5.0) as mgr:
        empty_owner, owner = object(), object()
        mgr.register(empty_owner)
        mgr.register(owner)
        outcomes: dict[str, object] = {}

        async def ask(name: str, instance: object, requests: dict[str, ArrayRequest]) -> None:
            outcomes[name] = await mgr.request(instance, requests)

        import anyio

        async with anyio.create_task_group() as tasks:  # both asked: one batch, closed at once
            tasks.start_soon(
                ask,
                "empty",
                empty_owner,
                {"z": ArrayRequest((0, 3), "f8"), "p": ArrayRequest((2,), "f8", unchunkable=True)},
            )
            tasks.start_soon(ask, "full", owner, {"k": ArrayRequest((1000,), "f4")})
        empty, full = outcomes["empty"], outcomes["full"]
        assert isinstance(empty, type(full))
        assert (empty.chunks, empty.chunk_length, empty.runs) == (full.chunks, full.chunk_length, 1000)  # type: ignore[attr-defined]
        assert full.chunks > 1  # type: ignore[attr-defined]
        assert empty.chunked_shapes == {"z": (0, 3), "p": (2,)}  # type: ignore[attr-defined]
        z_in, z_out = np.zeros((0, 3)), np.zeros((0, 3))
        p = np.array([1.0, 2.0])
        seen = []
        async for chunk in walk_chunks(empty, inputs={"z": z_in, "p": p}, outputs={"z": z_out}):  # type: ignore[arg-type]
            assert chunk.device["z"].shape == (0, 3) and chunk.host["z"].shape == (0, 3)
            np.testing.assert_array_equal(chunk.device["p"].get(), p)
            seen.append((chunk.start, chunk.stop))
        assert seen == list(full.chunk_ranges())  # type: ignore[attr-defined]  # in lockstep with its batch-mate
        mgr.release(empty)  # type: ignore[arg-type]
        mgr.release(full)  # type: ignore[arg-type]
    assert sim.used == 0
