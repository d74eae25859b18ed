"""cubie 0.17's behaviours in aiocubie itself (issue 25), on the simulator, through the public API.

Each test is the regression test of one gap a cubie program met: how length-1 run axes are
batched, what a one-run batch reports, owner-scoped notifications, replacing a label,
``manual_proportion`` and ``update``, no 20x warning before a refusal, and where a request
moved to another group is counted.
"""

from __future__ import annotations

import warnings

import anyio
import numpy as np
import pytest
from simkit import HANG_GUARD

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.errors import (
    BudgetError,
    ConfigurationError,
    InsufficientMemoryError,
    InvalidRequestError,
    RegistrationError,
    UnchunkableTooLargeError,
)
from aiocubie.simulator import SimulatorBackend


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


# -- no 20x warning before a refusal, nor for a batch walked in many chunks ----------------------
@pytest.mark.anyio
async def test_the_manager_refuses_without_an_oversubscription_warning(sim: SimulatorBackend) -> None:
    """The error says it all: no warning comes before it (the cubie adapter warns for solves)."""
    solver = Part()
    async with MemoryManager(sim) as mgr:
        mgr.register(solver)
        too_big = {"table": ArrayRequest((30_000_000,), "u1", unchunkable=True)}  # 30x the device
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(UnchunkableTooLargeError):
                await mgr.request(solver, too_big)
            with pytest.raises(InsufficientMemoryError, match="chunk_axis=0"):  # a run: 1.6 MB, along axis 1
                await mgr.request(solver, {"runs": ArrayRequest((200_000, 25), "f8", chunk_axis=1)})
            # the library's normal use: 40 MB walked through 256 KiB chunks
            async with mgr.request(solver, {"x": ArrayRequest((1_000_000, 40), "u1")}) as response:
                assert response.chunks > 20


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
                mgr.groups.move(mover, "new")
                mgr.groups.flush("new")
        groups = mgr.stats().groups
        assert (groups["new"].requests, groups["new"].batches, groups["new"].chunks) == (1, 1, 1)
        assert (groups["old"].requests, groups["old"].batches) == (0, 0)
        assert groups["new"].live_bytes == 800 and groups["old"].live_bytes == 0
        assert got[0].stream is mgr.groups.stream(mover)


# -- manual_proportion and update ---------------------------------------------------------------
def test_manual_proportion_is_none_in_the_auto_pool(sim: SimulatorBackend) -> None:
    mgr = MemoryManager(sim)
    auto, manual = Part(), Part()
    mgr.register(auto)
    mgr.register(manual, proportion=0.25)
    assert mgr.budget.manual_proportion(auto) is None
    assert mgr.budget.manual_proportion(manual) == 0.25
    mgr.budget.set_auto(manual)
    assert mgr.budget.manual_proportion(manual) is None
    with pytest.raises(RegistrationError):
        mgr.budget.manual_proportion(Part())


def test_update_changes_settings_by_name(sim: SimulatorBackend) -> None:
    """cubie 0.17's update(): stream_group, mem_proportion (None: auto), memory_manager (this one)."""
    mgr = MemoryManager(sim)
    solver, other = Part(), Part()
    mgr.register(solver)
    mgr.register(other)
    assert mgr.budget.update(solver, {"stream_group": "solve"}, mem_proportion=0.3) == {
        "stream_group",
        "mem_proportion",
    }
    assert (mgr.groups.group_of(solver), mgr.budget.manual_proportion(solver)) == ("solve", 0.3)
    assert mgr.budget.update(solver, stream_group=None, mem_proportion=None, memory_manager=mgr) == {
        "stream_group",
        "mem_proportion",
        "memory_manager",
    }
    assert (mgr.groups.group_of(solver), mgr.budget.manual_proportion(solver)) == ("solve", None)
    assert mgr.budget.proportion(solver) == mgr.budget.proportion(other) == 0.5
    assert mgr.budget.update(solver, mem_proportion=None) == {"mem_proportion"}  # already auto: no change
    assert mgr.budget.update(solver, {"dt": 0.1, "stream_group": "solve"}, silent=True) == {"stream_group"}
    with pytest.raises(ConfigurationError, match="'dt'"):
        mgr.budget.update(solver, dt=0.1, mem_proportion=0.2)
    assert mgr.budget.manual_proportion(solver) is None  # a refused update changes nothing
    with pytest.raises(RegistrationError, match="cannot change memory manager"):
        mgr.budget.update(solver, memory_manager=MemoryManager(SimulatorBackend(total=1000)))
    with pytest.raises(BudgetError):
        mgr.budget.update(solver, mem_proportion=1.5)


# -- owner-scoped notifications -----------------------------------------------------------------
@pytest.mark.anyio
async def test_owner_scoped_members_are_told_only_their_owners_plans(sim: SimulatorBackend) -> None:
    """cubie 0.17 tells a batch's plan only to the requesting owner's members (its kernel applies
    every plan it is told); a member registered without an owner is told every plan, as before."""
    solver_a, solver_b, inputs_a, legacy = Part(), Part(), Part(), Part()
    told: dict[str, list[tuple[int, int, dict[str, object]]]] = {"a": [], "b": [], "inputs": [], "legacy": []}

    def hook(name: str):  # type: ignore[no-untyped-def]
        return lambda r: told[name].append((r.chunks, r.chunk_length, r.arrays))

    async with MemoryManager(sim) as mgr:
        mgr.register(solver_a, stream_group="g", ready_hook=hook("a"), owner=solver_a)
        mgr.register(solver_b, stream_group="g", ready_hook=hook("b"), owner=solver_b)
        mgr.register(inputs_a, stream_group="g", ready_hook=hook("inputs"), owner=solver_a)
        mgr.register(legacy, stream_group="g", ready_hook=hook("legacy"))
        mgr.groups.flush()
        with anyio.fail_after(HANG_GUARD):
            response = await mgr.request(inputs_a, {"y0": ArrayRequest((2, 10), "f8", chunk_axis=1)})
        assert [(c, n) for c, n, _ in told["inputs"]] == [(1, 10)] and told["inputs"][0][2] == response.arrays
        assert told["a"] == [(1, 10, {})]  # its owner asked: told the plan, with no arrays
        assert told["b"] == []  # another owner's batch: not told
        assert told["legacy"] == [(1, 10, {})]  # no owner: told every batch, as before
        with anyio.fail_after(HANG_GUARD):
            await mgr.request(solver_b, {"y0": ArrayRequest((2, 5), "f8", chunk_axis=1)})
        assert len(told["a"]) == 1 and len(told["inputs"]) == 1  # b's batch is not a's
        assert [(c, n) for c, n, _ in told["b"]] == [(1, 5)] and len(told["legacy"]) == 2


# -- replacing a label --------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_replacing_request_frees_the_label_first(sim: SimulatorBackend) -> None:
    """cubie replaces a label's array when the label is asked for again; aiocubie keeps both
    unless the request says replace=True, which plans the batch with the old array's bytes back."""
    solver = Part()
    state = {"state": ArrayRequest((600, 125), "f8", chunk_axis=1)}  # 600 kB of a 1 MB device
    async with MemoryManager(sim) as mgr:
        mgr.register(solver)
        with anyio.fail_after(HANG_GUARD):
            first = await mgr.request(solver, state)
            kept = await mgr.request(solver, state)  # both held: the second one is chunked
            assert (first.chunks, kept.chunks) == (1, 2)
            assert mgr.stats().groups["default"].live_bytes == 600_000 + 600 * kept.chunk_length * 8
            replaced = await mgr.request(solver, state, replace=True)  # frees both, fits whole
        assert replaced.chunks == 1
        assert mgr.stats().groups["default"].live_bytes == 600_000
        mgr.release(first)  # released already: a no-op
        assert mgr.stats().groups["default"].live_bytes == 600_000
        other = mgr.allocate(
            solver, {"state": ArrayRequest((10,), "f8"), "p": ArrayRequest((4,), "f8", unchunkable=True)}, replace=True
        )
        assert mgr.stats().groups["default"].live_bytes == 80 + 32
        mgr.release(other)
        with pytest.raises(InvalidRequestError, match="replace takes True or False"):
            mgr.request(solver, state, replace="yes")  # type: ignore[arg-type]
