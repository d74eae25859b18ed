"""cubie 0.17's solver through ``aiocubie.cubie`` on cubie's CUDA simulator (skipped without cubie).

The targets of issue 25: a solve through the adapter gives results bitwise identical to the same
solve on cubie's own memory manager, with the same chunk plans for the same free memory; its
batches share aiocubie's budgets and stats with async components, and ``solve`` awaits it from an
async program without blocking the loop.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import threading
import warnings
from typing import Any

import anyio
import numpy as np
import pytest

import aiocubie

if importlib.util.find_spec("cubie") is None:
    pytest.skip("cubie is not installed (pip install 'aiocubie[cubie]')", allow_module_level=True)
if aiocubie.gpu_status()[0]:  # on a GPU, cubie compiles for it (tests/gpu): not numba's simulator
    pytest.skip("a GPU is present: the cubie tests here run on cubie's simulator only", allow_module_level=True)
os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # read by cubie when it is imported, next
_CACHE = tempfile.TemporaryDirectory(prefix="aiocubie-cubie-")  # cubie writes generated code (removed at exit)
os.environ.setdefault("CUBIE_CACHE_DIR", _CACHE.name)

from cubie import Solver, create_ODE_system  # noqa: E402
from cubie.memory import MemoryManager as CubieOwn  # noqa: E402

from aiocubie.cubie import CUBIE_HEADROOM, CubieMemoryManager, solve  # noqa: E402

RUNS = 48
GRANULE = 512  # bytes each manager keeps free of a batch (cubie's is 32 MiB; kept small so the device is)
SOLVE = {"duration": 0.05, "dt": 0.01, "save_every": 0.01, "grid_type": "verbatim"}


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(25)
    return rng.uniform(0.5, 2.0, (2, RUNS)), rng.uniform(1.0, 3.0, (1, RUNS))


@pytest.fixture(scope="module")
def system() -> Any:
    return create_ODE_system(
        ["dx = v", "dv = mu * (1 - x*x) * v - x"], states={"x": 1.0, "v": 0.0}, parameters={"mu": 1.5}
    )


class _CubieWithFree(CubieOwn):  # type: ignore[misc]
    """cubie's own manager on a device with ``free`` bytes free."""

    def __init__(self, free: int) -> None:
        self._free = free
        super().__init__(allocation_granule_bytes=GRANULE)

    def get_memory_info(self) -> tuple[int, int]:
        return self._free, 8 * 1024**3


def _solve(system: Any, manager: Any) -> tuple[tuple[int, int], dict[str, np.ndarray]]:
    solver = Solver(system, algorithm="euler", memory_manager=manager)
    try:
        inits, params = _inputs()
        result = solver.solve(inits, params, **SOLVE)
        plan = (solver.kernel.run_params.num_chunks, solver.kernel.run_params.chunk_length)
        return plan, {"state": np.array(result.state), "status": np.array(result.status_codes)}
    finally:
        solver.close()


def _whole_bytes(system: Any) -> int:
    """What the batch asks aiocubie for, whole (read from a solve on a roomy device)."""
    mm = CubieMemoryManager(backend=aiocubie.simulator.SimulatorBackend(total=10**8, granule=GRANULE))
    try:
        _solve(system, mm)
        return mm.aiocubie.stats().groups["solver"].peak_bytes
    finally:
        mm.close()


def test_plans_and_results_match_cubies_own_manager(system: Any) -> None:
    """At 17 free-memory sizes, from roomy down to a few runs a chunk: the same chunk plans, and
    results bitwise identical to cubie's own manager."""
    whole = _whole_bytes(system)
    sizes = sorted({int(whole * f) + GRANULE for f in np.geomspace(0.06, 1.3, 17)}, reverse=True)
    plans = []
    for free in sizes:
        own_plan, own = _solve(system, _CubieWithFree(free))
        mm = CubieMemoryManager(backend=aiocubie.simulator.SimulatorBackend(total=free, granule=GRANULE))
        try:
            plan, ours = _solve(system, mm)
        finally:
            mm.close()
        assert plan == own_plan, f"free={free}: aiocubie planned {plan}, cubie {own_plan}"
        for name in own:
            assert ours[name].tobytes() == own[name].tobytes(), f"free={free}: {name} differs"
        plans.append(plan)
    chunk_counts = [chunks for chunks, _ in plans]
    assert chunk_counts[0] == 1 and max(chunk_counts) >= 10  # roomy, and down to many chunks
    assert chunk_counts == sorted(chunk_counts)


def test_arrays_asked_for_again_keep_the_partition_their_peers_are_cut_to(system: Any) -> None:
    """A second solve that changes only the outputs asks only for them: as cubie does, they are cut
    to the partition the inputs (still held) are cut to, and the results stay cubie's own."""
    free = _whole_bytes(system) // 2 + GRANULE
    runs = []
    for manager in (
        _CubieWithFree(free),
        CubieMemoryManager(backend=aiocubie.simulator.SimulatorBackend(total=free, granule=GRANULE)),
    ):
        solver = Solver(system, algorithm="euler", memory_manager=manager)
        inits, params = _inputs()
        first = solver.solve(inits, params, **SOLVE)
        plan = (solver.kernel.run_params.num_chunks, solver.kernel.run_params.chunk_length)
        shorter = solver.solve(inits, params, **{**SOLVE, "duration": 0.03})
        kept = (solver.kernel.run_params.num_chunks, solver.kernel.run_params.chunk_length)
        runs.append((plan, kept, np.array(first.state).tobytes(), np.array(shorter.state).tobytes()))
        solver.close()
        if isinstance(manager, CubieMemoryManager):
            assert manager.aiocubie.stats().groups["solver"].requests == 3  # inputs once, outputs twice
            manager.close()
    assert runs[0] == runs[1]
    assert runs[0][0] == runs[0][1] and runs[0][0][0] > 1  # chunked, and the partition kept


def test_a_solve_on_its_own_loop_thread_shares_stats_and_frees_everything(system: Any) -> None:
    mm = CubieMemoryManager(backend=aiocubie.simulator.SimulatorBackend(total=10**8))
    assert mm.aiocubie.options.headroom == CUBIE_HEADROOM
    try:
        solver = Solver(system, algorithm="euler", memory_manager=mm, mem_proportion=0.4)
        assert mm.proportion(solver.kernel) == mm.aiocubie.budget.proportion(solver.kernel) == 0.4
        assert mm.manual_proportion(solver.kernel) == 0.4
        inits, params = _inputs()
        first = solver.solve(inits, params, **SOLVE)
        again = solver.solve(inits, params, **SOLVE)  # the same arrays: nothing asked again
        assert np.array_equal(first.state, again.state)
        stats = mm.aiocubie.stats()
        assert stats.groups["solver"].batches == 1 and stats.groups["solver"].requests == 2
        assert stats.groups["solver"].live_bytes > 0
        solver.update_memory_settings(mem_proportion=None)  # cubie 0.17's update: back to auto
        assert mm.manual_proportion(solver.kernel) is None
        bigger = solver.solve(np.hstack([inits, inits]), np.hstack([params, params]), **SOLVE)
        assert np.array_equal(bigger.state[..., :RUNS], first.state)  # labels replaced, not kept
        now = mm.aiocubie.stats().groups["solver"]
        assert now.live_bytes == now.peak_bytes > stats.groups["solver"].live_bytes  # the old ones went first
        solver.update_memory_settings(stream_group="moved")  # moves the kernel and its array managers
        assert {mm.aiocubie.groups.group_of(solver.kernel), mm.get_stream_group(solver.kernel)} == {"moved"}
        assert mm.aiocubie.groups.members()["moved"] and "solver" not in mm.aiocubie.groups.members()
        solver.solve(inits, params, **SOLVE)
        assert mm.aiocubie.stats().groups["moved"].live_bytes == stats.groups["solver"].live_bytes  # RUNS again
        solver.close()
        assert not mm.aiocubie.stats().groups["moved"].live_bytes
    finally:
        mm.close()


def test_a_batch_that_cannot_fit_raises_aiocubies_error(system: Any) -> None:
    """Not even one run fits: the solve raises aiocubie's planning error itself (not in a group),
    with no oversubscription warning before it."""
    mm = CubieMemoryManager(backend=aiocubie.simulator.SimulatorBackend(total=48))  # one run needs more
    try:
        solver = Solver(system, algorithm="euler", memory_manager=mm)
        with warnings.catch_warnings():
            warnings.simplefilter("error", aiocubie.errors.AiocubieWarning)
            with pytest.raises(aiocubie.errors.PlanningError, match="offered"):
                solver.solve(*_inputs(), **SOLVE)
        assert mm.aiocubie.stats().groups["solver"].live_bytes == 0
        solver.close()
    finally:
        mm.close()


def test_a_solve_over_20x_the_free_memory_is_warned_about_with_its_plan(system: Any) -> None:
    """As cubie's manager warns: a solve's batch planned in chunks over 20x the free memory says so."""
    whole = _whole_bytes(system)
    mm = CubieMemoryManager(backend=aiocubie.simulator.SimulatorBackend(total=whole // 22, granule=0))
    try:
        solver = Solver(system, algorithm="euler", memory_manager=mm)
        with pytest.warns(
            aiocubie.errors.AiocubieWarning, match=r"more than 20x the \d+ bytes free: it is walked in \d+ chunks"
        ):
            solver.solve(*_inputs(), **SOLVE)
        assert solver.kernel.run_params.num_chunks > 20
        solver.close()
    finally:
        mm.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_awaited_solve_is_planned_against_what_a_loader_holds(system: Any, anyio_backend: str) -> None:
    """One budget: a loader's arrays on the same device make the solve chunk; the loop keeps
    serving the loader while the solve runs in a worker thread."""
    whole = _whole_bytes(system)
    loader = object.__new__(type("Loader", (), {}))
    async with aiocubie.MemoryManager(aiocubie.simulator.SimulatorBackend(total=whole * 4, granule=GRANULE)) as mgr:
        mgr.register(loader, stream_group="load")
        mm = CubieMemoryManager(mgr)
        solver = Solver(system, algorithm="euler", memory_manager=mm)
        inits, params = _inputs()
        alone = await solve(solver, inits, params, **SOLVE)
        assert solver.kernel.run_params.num_chunks == 1
        held = await mgr.request(loader, {"batch": aiocubie.ArrayRequest((whole * 5 // 2,), "u1", unchunkable=True)})
        loop_thread, served = threading.get_ident(), []

        async def keep_loading() -> None:
            for _ in range(5):
                async with mgr.request(loader, {"x": aiocubie.ArrayRequest((16,), "f8")}):
                    served.append(threading.get_ident())

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_loading)  # twice the runs: asked for again, and planned
            doubled = await solve(solver, np.hstack([inits, inits]), np.hstack([params, params]), **SOLVE)
        assert solver.kernel.run_params.num_chunks > 1  # planned against what the loader holds
        assert served == [loop_thread] * 5
        assert np.array_equal(doubled.state[..., RUNS:], alone.state)
        stats = mgr.stats()
        assert {"load", "solver"} <= set(stats.groups) and stats.groups["solver"].chunks > 1
        mgr.release(held)
        again = await solve(solver, inits, params, **SOLVE)
        assert solver.kernel.run_params.num_chunks == 1 and np.array_equal(again.state, alone.state)
        mgr.pool.invalidate_all()  # a context reset: cubie's array managers drop their arrays, and ask again
        assert mgr.stats().groups["solver"].live_bytes == 0
        after = await solve(solver, inits, params, **SOLVE)
        assert np.array_equal(after.state, alone.state) and mgr.stats().groups["solver"].live_bytes > 0
        solver.close()
        with pytest.raises(aiocubie.errors.ManagerStateError, match="worker thread"):
            solver2 = Solver(system, algorithm="euler", memory_manager=mm)
            solver2.solve(inits, params, **SOLVE)  # on the loop's thread: refused, not a deadlock
        with pytest.raises(aiocubie.errors.ConfigurationError, match="not aiocubie's"):
            await solve(Solver(system, algorithm="euler"), inits, params, **SOLVE)
