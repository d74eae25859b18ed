"""cubie 0.17's behaviours in aiocubie itself (issue 25), on the simulator, through the public API.

Each test is the regression test of one gap a cubie program met: how length-1 run axes are
batched, what a one-run batch reports, owner-scoped notifications, replacing a label,
``manual_proportion`` and ``update``, the 20x warning before a refusal, and where a request
moved to another group is counted.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest
from simkit import HANG_GUARD

from aiocubie import (
    AiocubieWarning,
    ArrayRequest,
    InsufficientMemoryError,
    MemoryManager,
    SimulatorBackend,
    UnchunkableTooLargeError,
)


class Part:
    """A component (weakly referenceable, with a name for messages)."""


# -- length-1 run axes, one-run batches ---------------------------------------------------------
@pytest.mark.anyio
async def test_length_one_run_axes_batch_beside_n_runs(sim: SimulatorBackend) -> None:
    """cubie asks for a run's parameters with a run axis of length 1 beside N-run states: they
    batch together, the length-1 array is unchunkable (whole in every chunk)."""
    solver, loader = Part(), Part()
    async with MemoryManager(sim, batch_window=5.0) as mgr:
        mgr.register(solver, stream_group="g")
        mgr.register(loader, stream_group="g")
        params = {"p": ArrayRequest((3, 1), np.float64, chunk_axis=1)}
        states = {"s": ArrayRequest((2, 100), np.float32, chunk_axis=1)}
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                got: dict[str, object] = {}

                async def ask(part: Part, requests: dict[str, ArrayRequest], key: str) -> None:
                    got[key] = await mgr.request(part, requests)

                tg.start_soon(ask, solver, {**params, **states}, "solver")
                tg.start_soon(ask, loader, params, "loader")
        a, b = got["solver"], got["loader"]
        assert (a.runs, a.chunks, a.chunk_length) == (b.runs, b.chunks, b.chunk_length) == (100, 1, 100)  # type: ignore[attr-defined]
        assert a.chunk_axes == {"p": None, "s": 1}  # type: ignore[attr-defined]
        assert b.arrays["p"].shape == (3, 1)  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_one_run_batch_reports_one_run(sim: SimulatorBackend) -> None:
    """A batch whose only run axes have length 1 is one run: chunk_length 1 (cubie refuses 0)."""
    solver = Part()
    async with MemoryManager(sim) as mgr:
        mgr.register(solver)
        response = await mgr.request(
            solver,
            {"y0": ArrayRequest((2, 1), np.float64, chunk_axis=1), "out": ArrayRequest((5, 2, 1), "f4", chunk_axis=2)},
        )
        assert (response.runs, response.chunks, response.chunk_length) == (1, 1, 1)
        assert list(response.chunk_ranges()) == [(0, 1)]
        assert response.arrays["out"].shape == (5, 2, 1)


# -- the 20x warning before a refusal -----------------------------------------------------------
@pytest.mark.anyio
async def test_the_manager_warns_20x_before_refusing(sim: SimulatorBackend) -> None:
    """As cubie's manager does: a batch over 20x the free memory is warned about, then refused."""
    solver = Part()
    async with MemoryManager(sim) as mgr:
        mgr.register(solver)
        too_big = {"table": ArrayRequest((30_000_000,), "u1", unchunkable=True)}  # 30x the device
        with pytest.warns(AiocubieWarning, match="more than 20x"), pytest.raises(UnchunkableTooLargeError):
            await mgr.request(solver, too_big)
        with pytest.warns(AiocubieWarning, match="more than 20x"), pytest.raises(InsufficientMemoryError):
            await mgr.request(solver, {"runs": ArrayRequest((200_000, 25), "f8", chunk_axis=1)})  # a run: 1.6 MB


# -- a request moved by change_stream_group -----------------------------------------------------
@pytest.mark.anyio
async def test_a_moved_request_is_counted_in_its_new_group(sim: SimulatorBackend) -> None:
    """Its memory sits in the new group, and so do its request, batch and chunks in the stats."""
    mover, stays = Part(), Part()
    async with MemoryManager(sim, batch_window=60.0) as mgr:
        mgr.register(mover, stream_group="old")
        mgr.register(stays, stream_group="old")  # so the request waits in old's open batch
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                got = []

                async def ask() -> None:
                    got.append(await mgr.request(mover, {"x": ArrayRequest((100,), "f8")}))

                tg.start_soon(ask)
                while mgr.stats().groups["old"].requests == 0:
                    await anyio.sleep(0)
                mgr.change_stream_group(mover, "new")
                mgr.flush("new")
        groups = mgr.stats().groups
        assert (groups["new"].requests, groups["new"].batches, groups["new"].chunks) == (1, 1, 1)
        assert (groups["old"].requests, groups["old"].batches) == (0, 0)
        assert groups["new"].live_bytes == 800 and groups["old"].live_bytes == 0
        assert got[0].stream is mgr.get_stream(mover)
