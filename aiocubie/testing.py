"""pytest fixtures for testing code that uses aiocubie, on the simulator backend (no GPU needed).

Installed with aiocubie, they load in every pytest session (a ``pytest11`` entry point,
``aiocubie_pytest``, which imports aiocubie only when a fixture is set up); an explicit
``pytest_plugins = ["aiocubie.testing"]`` does no harm. It imports pytest, so only test code
may import it; it never imports numba.cuda.

Fixtures
--------
aiocubie_config
    The settings of this test: defaults, updated by ``@pytest.mark.aiocubie(...)``.
aiocubie_simulator
    A :class:`~aiocubie.simulator.SimulatorBackend` built from ``aiocubie_config``.
aiocubie_faults
    Its :class:`~aiocubie.simulator.Faults`: ``aiocubie_faults.inject("allocate", after=1)``.
aiocubie_manager
    A running :class:`~aiocubie.MemoryManager` on ``aiocubie_simulator``, for tests run by
    anyio's plugin (``@pytest.mark.anyio``, asyncio or trio).
aiocubie_manager_factory
    ``async with aiocubie_manager_factory(total=..., mode="active") as mgr:`` inside any
    async test, whatever runs it (pytest-asyncio included); each call makes its own simulator,
    over the test's ``@pytest.mark.aiocubie`` settings.
aiocubie_asyncio_manager
    A running manager, like ``aiocubie_manager``, for pytest-asyncio tests (where pytest-asyncio
    is installed).

A running manager owns a task group, which only the task that entered it may leave. anyio's
plugin runs a fixture's setup and teardown in the test's task; pytest-asyncio does not. A
hand-written ``@pytest_asyncio.fixture`` that does ``async with MemoryManager() as mgr: yield
mgr`` still works: its teardown (another task) fails what is pending, frees every array and
stops the schedulers, but it cannot wait for the manager's tasks, so an error in an async hook
task goes unreported. ``aiocubie_asyncio_manager`` (it runs the manager in a task of its own)
and the factory inside the test wait for them.

Examples
--------
.. code-block:: python

    @pytest.mark.anyio
    @pytest.mark.aiocubie(total=1 << 20)
    async def test_solver_chunks(aiocubie_manager):
        solver = Solver()
        aiocubie_manager.register(solver)
        response = await aiocubie_manager.request(solver, solver.requests(runs=100_000))
        assert response.chunks > 1
"""

from __future__ import annotations

import aiocubie_pytest
from aiocubie_pytest import *  # noqa: F403 - the fixtures, as pytest and ``import`` see them

__all__ = list(aiocubie_pytest.__all__)  # with aiocubie_asyncio_manager where pytest-asyncio is installed
