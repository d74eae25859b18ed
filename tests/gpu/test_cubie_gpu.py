"""cubie 0.17's solver through ``aiocubie.cubie`` on the GPU, beside cubie's own memory manager.

cubie compiles with its own numba build (``numba_cuda_mlir``); aiocubie's arrays reach it through
the CUDA array interface. Skipped without cubie (``pip install "aiocubie[cubie]"``) or a GPU.
cubie is imported inside the test: importing it at collection would fix its choice between the
GPU and its simulator for the CPU tests after this file.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

RUNS = 100_000


def _system() -> Any:
    from cubie import create_ODE_system

    return create_ODE_system(
        ["dx = v", "dv = mu * (1 - x*x) * v - x"], states={"x": 1.0, "v": 0.0}, parameters={"mu": 1.5}
    )


def test_a_gpu_solve_through_the_adapter_is_cubies_own(tmp_path: Path) -> None:
    if importlib.util.find_spec("cubie") is None:
        pytest.skip("cubie is not installed (pip install 'aiocubie[cubie]')")
    os.environ.setdefault("CUBIE_CACHE_DIR", str(tmp_path))
    from cubie import Solver

    from aiocubie.cubie import CubieMemoryManager

    system = _system()
    rng = np.random.default_rng(25)
    inits, params = rng.uniform(0.5, 2.0, (2, RUNS)), rng.uniform(1.0, 3.0, (1, RUNS))
    settings = {"duration": 1.0, "dt": 0.001, "save_every": 0.1}
    own = Solver(system, algorithm="euler")
    expected = own.solve(inits, params, **settings)
    own_plan = (own.kernel.run_params.num_chunks, own.kernel.run_params.chunk_length)
    own.close()
    mm = CubieMemoryManager(backend="cuda")
    try:
        solver = Solver(system, algorithm="euler", memory_manager=mm)
        got = solver.solve(inits, params, **settings)
        plan = (solver.kernel.run_params.num_chunks, solver.kernel.run_params.chunk_length)
        assert plan == own_plan == (1, RUNS)
        assert np.array(got.state).tobytes() == np.array(expected.state).tobytes()
        assert np.array(got.status_codes).tobytes() == np.array(expected.status_codes).tobytes()
        stats = mm.aiocubie.stats().groups["solver"]
        assert stats.batches == 1 and stats.live_bytes > 0
        solver.close()
        assert mm.aiocubie.stats().groups.get("solver") is None or mm.aiocubie.stats().groups["solver"].live_bytes == 0
    finally:
        mm.close()
